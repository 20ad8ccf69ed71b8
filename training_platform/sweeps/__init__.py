"""Sweeps: a SweepSpec run as an Optuna study (RDB storage) whose trials are training runs."""

from training_platform.sweeps.driver import SweepDriver, SweepResult, TrialOutcome
from training_platform.sweeps.queue import QueuedSweep, SweepQueue
from training_platform.sweeps.runner import run_sweep
from training_platform.sweeps.spec import SweepSpec, load_sweep, parse_sweep
from training_platform.sweeps.trial import TrialContext

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
