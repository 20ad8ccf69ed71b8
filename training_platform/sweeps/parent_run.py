"""The sweep's parent MLflow run: each trial's run is nested under it (`mlflow.parentRunId`)."""

from __future__ import annotations

from pathlib import Path

from training_platform.registry import tracking
from training_platform.sweeps.driver import SweepResult
from training_platform.sweeps.spec import SweepSpec


def start_parent_run(tracking_uri: str, artifact_root: Path, sweep: SweepSpec) -> str:
    """A run in the base spec's experiment (where the trials land) that stands for the whole sweep."""
    base = sweep.base_spec
    tags = {
        "team": base.team,
        "owner": base.owner,
        "sweep": sweep.name,
        "sampler": sweep.sampler.type,
        "pruner": sweep.pruner.type,
        "training_run": f"sweep-{sweep.name}",
        "mlflow.runName": f"sweep-{sweep.name}",
    }
    return tracking.start_run(tracking_uri, artifact_root, base, tags)


def end_parent_run(tracking_uri: str, mlflow_run_id: str, result: SweepResult) -> None:
    summary = result.as_dict()
    figures = {k: float(summary[k]) for k in ("trials", "complete", "pruned", "fail", "total_steps", "total_cost_usd")}
    if result.best is not None and result.best.value is not None:
        figures["best_value"] = result.best.value
        tracking.set_tags(tracking_uri, mlflow_run_id, {"best_run_id": result.best.run_id})
    tracking.log_metrics(tracking_uri, mlflow_run_id, figures)
    tracking.end_run(tracking_uri, mlflow_run_id, result.best is not None)
