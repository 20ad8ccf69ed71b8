"""What strategies, framework adapters and the template loop call on a session: not a script's API.

A script sees a handful of names on TrainingSession (start, spec, dist, run_id, run_dir, dataset, restore,
after_step and its parts report, save and should_stop, evaluate_with, finish). What the platform's own code needs
besides sits behind `session.hooks`, typed by this protocol: the checkpoint store a strategy writes its own
format to and the bookkeeping after it saved or restored one, the checkpoints a framework may restore from, the
step count of a loop the platform does not drive, the MLflow flavour a framework's model is logged with, signal
handling a framework overrides, and what the template loop and the worker's entry point read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path

    from training_platform.checkpoints import CheckpointManifest, CheckpointStore
    from training_platform.train.evaluation_mode import EvaluationRequest, ModelLogger
    from training_platform.train.reporting import Reporter


class SessionHooks(Protocol):
    @property
    def store(self) -> CheckpointStore:
        """The run's checkpoint store (an evaluation's: the evaluated run's)."""

    @property
    def checkpoint_key(self) -> str:
        """Where this attempt's checkpoints live in the store."""

    @property
    def reporter(self) -> Reporter:
        """Progress, metrics and failures to Dagster and MLflow (main rank only)."""

    @property
    def snapshot_root(self) -> Path | str:
        """Where the run's snapshot lives."""

    @property
    def evaluation(self) -> EvaluationRequest | None:
        """The checkpoint this process evaluates; None in training."""

    @property
    def exit_code(self) -> int:
        """What the worker exits with once the script returns (a run stopped for preemption: PREEMPTED)."""

    def start_writer(self) -> None:
        """Start the background checkpoint writer before the first save (DDP: before its process group forks)."""

    def should_checkpoint(self, step: int) -> bool:
        """Whether a save is due at `step` (and, when it is, that the cadence counts it as saved)."""

    def exit_preempted(self, step: int) -> None:
        """Leave for a preemption at `step`, the checkpoint already saved."""

    def data_wait(self) -> AbstractContextManager[None]:
        """Around a batch fetch: the run's telemetry counts the wait."""

    def flush(self) -> None:
        """Wait until every checkpoint in flight is durable (or reported failed)."""

    def overlap_saves(self) -> None:
        """The strategy calls `before_update` before each optimizer step, and its saved state changes only there
        (a module's buffers, changed by forward, are its own copies): a periodic save's copy of the state then
        runs beside the next forward and backward."""

    def before_update(self) -> None:
        """The loop is about to change its state (its optimizer step): a save's copy of it completes first."""

    def checkpoint_saved(self, manifest: CheckpointManifest, seconds: float = 0.0) -> None:
        """After a strategy's own collective save (sharded DCP, DeepSpeed, a framework's directory): retention,
        the save's cost, the run's events. Main rank only; others return."""

    def checkpoint_failed(self, step: int, error: str) -> None:
        """After a strategy's save in the background failed on every rank: training goes on, the next save
        tries again, and the previous checkpoint stays restorable."""

    def checkpoint_restored(self, manifest: CheckpointManifest, step: int) -> None:
        """After a strategy or framework restored its own checkpoint (RNG already set by it)."""

    def restore_candidates(self) -> list[CheckpointManifest]:
        """The checkpoints a framework's own restore may start from, newest first (the first that verifies
        wins); in an evaluation, only the one it evaluates."""

    def step_started(self) -> None:
        """Count a step of a loop whose batch fetch the platform cannot wrap (a framework's own)."""

    def log_model_with(self, logger: ModelLogger) -> None:
        """How the platform's evaluation logs the model to MLflow (default: the pytorch flavour)."""

    def take_signals(self) -> None:
        """(Re)install the preemption handler, after a framework installed its own (Lightning does)."""
