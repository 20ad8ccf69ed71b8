"""The frameworks a run's ranks import past torch, and which of them a run uses: a warm standby loads them first.

A rank forked by a warm standby (standby.py) still imports what its run's strategy or script brings: DeepSpeed's
ZeRO checks its optimizer against Muon's, which loads torch's compiler (~1.3 s of each rank's CPU), a Lightning
script Lightning (~2 s), a Hugging Face one the Trainer (~1.8 s). A run that uses one of them asks for a shared
standby that loaded it as well (PRELOAD_ENV), so its ranks skip those imports too.

Each framework names the environment variables it reads as it is imported (HF_HUB_OFFLINE, DS_ACCELERATOR...):
they are part of such a standby's import environment, so a job whose values differ gets a standby of its own,
loaded with them, as a cold rank of that job would be.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the standby's requesters import this module: bare interpreters, nothing heavy
    from training_platform.spec import TrainSpec

# Set by the local launcher in the environment of a job whose ranks use frameworks: their names, comma-separated.
PRELOAD_ENV = "TP_STANDBY_PRELOAD"


@dataclass(frozen=True)
class Framework:
    modules: tuple[str, ...]  # what a standby imports for it: what its ranks would import
    env_prefixes: tuple[str, ...]  # the variables it reads as it is imported


FRAMEWORKS = {
    "deepspeed": Framework(
        ("deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer", "training_platform.train.strategies.deepspeed"),
        ("DS_",),
    ),
    "lightning": Framework(("lightning", "training_platform.train.adapters.lightning"), ("PL_", "LIGHTNING_")),
    "transformers": Framework(
        ("transformers", "training_platform.train.adapters.hf"), ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "TOKENIZERS_")
    ),
}


def frameworks_of(spec: TrainSpec) -> tuple[str, ...]:
    """What SPEC's ranks import past torch: DeepSpeed for its strategy, what its script imports at its top."""
    names = {"deepspeed"} if spec.strategy == "deepspeed" else set()
    code = spec.entrypoint.code if spec.entrypoint is not None else None
    if code is not None:
        names |= _imported_by(code.text)
    return tuple(sorted(names))


def preload_environment(spec: TrainSpec) -> dict[str, str]:
    """What a job of SPEC adds to its environment for its standby to load its frameworks: nothing if it uses none."""
    used = frameworks_of(spec)
    return {PRELOAD_ENV: ",".join(used)} if used else {}


def named(value: str) -> tuple[str, ...]:
    """The frameworks a PRELOAD_ENV value names, sorted; a name that is none of them is left out."""
    return tuple(sorted({name for name in value.split(",") if name in FRAMEWORKS}))


def _imported_by(script: str) -> set[str]:
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError):  # the run reports it, as it starts the script
        return set()
    roots: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.append(node.module.split(".")[0])
    return {root for root in roots if root in FRAMEWORKS}
