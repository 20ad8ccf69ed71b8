"""Sweeps: a SweepSpec run as an Optuna study (RDB storage) whose trials are training runs.

The driver and the runner import Optuna (0.2 s): they load on first use, so `tp`, which only reads and
submits sweep specs, starts without it.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from training_platform.sweeps.queue import QueuedSweep, SweepQueue
from training_platform.sweeps.spec import SweepSpec, load_sweep, parse_sweep
from training_platform.sweeps.trial import TrialContext

if TYPE_CHECKING:
    from training_platform.sweeps.driver import SweepDriver, SweepResult, TrialOutcome
    from training_platform.sweeps.runner import run_sweep

_LAZY = {
    "SweepDriver": "training_platform.sweeps.driver",
    "SweepResult": "training_platform.sweeps.driver",
    "TrialOutcome": "training_platform.sweeps.driver",
    "run_sweep": "training_platform.sweeps.runner",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "QueuedSweep",
    "SweepDriver",
    "SweepQueue",
    "SweepResult",
    "SweepSpec",
    "TrialContext",
    "TrialOutcome",
    "load_sweep",
    "parse_sweep",
    "run_sweep",
]
