"""A trial's link to its sweep, on both sides of the launch.

The orchestrator registers it with the trial's run (runs/registry.py: beside the submitted spec);
the training_run asset turns it into worker environment variables and MLflow nesting tags; the
worker's `TrialPruning` reports validation metrics into the study's RDB storage and asks the
study's pruner whether to stop. Rank 0 alone talks to the storage; no Dagster on either side.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from training_platform.paths import PlatformHome
from training_platform.runs.backends import open_run_registry

ENV_PREFIX = "TP_SWEEP_"


@dataclass(frozen=True)
class TrialContext:
    sweep: str
    storage: str
    trial_id: int
    trial_number: int
    metric: str
    direction: str
    pruner: dict
    parent_mlflow_run_id: str | None = None

    @classmethod
    def read(cls, home: PlatformHome, run_id: str) -> TrialContext | None:
        """The registered run's trial context; None for a run outside sweeps."""
        raw = open_run_registry(home).trial(run_id)
        return cls(**json.loads(raw)) if raw else None

    def worker_env(self) -> dict[str, str]:
        return {f"{ENV_PREFIX}CONTEXT": json.dumps(asdict(self))}

    def mlflow_tags(self) -> dict[str, str]:
        tags = {"sweep": self.sweep, "sweep_trial": str(self.trial_number)}
        if self.parent_mlflow_run_id:
            tags["mlflow.parentRunId"] = self.parent_mlflow_run_id
        return tags

    @classmethod
    def from_env(cls) -> TrialContext | None:
        raw = os.environ.get(f"{ENV_PREFIX}CONTEXT")
        return cls(**json.loads(raw)) if raw else None


class TrialPruning:
    """Worker side: report the objective metric at each validation step; remember a prune decision."""

    def __init__(self, context: TrialContext):
        import optuna

        from training_platform.sweeps.spec import PrunerSpec
        from training_platform.sweeps.study import build_pruner, open_storage, private_url

        self.context = context
        study = optuna.load_study(
            study_name=context.sweep,
            storage=open_storage(private_url(context.storage)),
            pruner=build_pruner(PrunerSpec(**context.pruner)),
        )
        self._trial = optuna.trial.Trial(study, context.trial_id)
        self.pruned_at: int | None = None
        self.last_value: float | None = None

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        """True once the pruner says stop; metrics without the objective are ignored."""
        value = metrics.get(self.context.metric)
        if value is None or self.pruned_at is not None:
            return self.pruned_at is not None
        self.last_value = float(value)
        self._trial.report(float(value), step)
        if self._trial.should_prune():
            self.pruned_at = step
        return self.pruned_at is not None
