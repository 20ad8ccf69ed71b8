"""What strategies, framework adapters and the template loop call on a session: not a script's API.

A script sees a handful of names on TrainingSession (start, dataset, restore, after_step, finish and
their parts). The bookkeeping after a checkpoint a strategy or a framework wrote or restored itself, the
checkpoints a framework may restore from, the step count of a loop the platform does not drive, the
MLflow flavour a framework's model is logged with, and signal handling a framework overrides sit behind
`session.hooks`, typed by this protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from training_platform.checkpoints import CheckpointManifest
    from training_platform.train.evaluation_mode import ModelLogger


class SessionHooks(Protocol):
    def checkpoint_saved(self, manifest: CheckpointManifest, seconds: float = 0.0) -> None:
        """After a strategy's own collective save (sharded DCP, DeepSpeed, a framework's directory): retention,
        the save's cost, the run's events. Main rank only; others return."""

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
