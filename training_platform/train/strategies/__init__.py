"""Distributed strategies, registered by name: the spec's ``strategy`` picks one.

Every strategy wraps a model and its optimizer, steps them, and saves and restores their
state through the checkpoint store. Modules are imported lazily: DeepSpeed costs seconds
to import and only its own runs pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training_platform.train.session import TrainingSession
    from training_platform.train.strategies.base import Strategy

STRATEGIES: dict[str, str] = {
    "ddp": "training_platform.train.strategies.ddp:DDPStrategy",
    "fsdp": "training_platform.train.strategies.fsdp:FSDPStrategy",
    "deepspeed": "training_platform.train.strategies.deepspeed:DeepSpeedStrategy",
}


def build_strategy(session: TrainingSession) -> Strategy:
    """The strategy the session's spec names, ready for `setup(model, make_optimizer)`."""
    name = session.spec.strategy
    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy {name!r}; use one of: {', '.join(STRATEGIES)}")
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)(session)
