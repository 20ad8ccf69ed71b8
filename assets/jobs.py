"""Asset jobs: what `tp`, the UI, schedules and sensors launch.

Every step of a run executes in the run's own process (in-process executor): the steps of a run
follow each other, and a step process per asset would import torch, MLflow and Dagster once more
each (about 4 s); terminating the run interrupts the one process that follows the job.
"""

import dagster as dg

from assets.partitions import training_runs
from training_platform.spec import TrainSpec
from training_platform.spec.submission import RUN_ASSETS, assets_for

snapshot_job = dg.define_asset_job(
    "dataset_snapshot_job",
    selection=dg.AssetSelection.assets("dataset_snapshot"),
    description="Build a snapshot.",
    executor_def=dg.in_process_executor,
)
training_pipeline = dg.define_asset_job(
    "training_pipeline",
    selection=dg.AssetSelection.assets(*RUN_ASSETS),
    partitions_def=training_runs,
    description="Train, checkpoint, evaluate and register one run (a training_runs partition).",
    executor_def=dg.in_process_executor,
)


def run_asset_keys(spec: TrainSpec) -> list[dg.AssetKey]:
    """What a training_pipeline run of `spec` materializes (a user's own script: training_run, checkpoints)."""
    return [dg.AssetKey(name) for name in assets_for(spec)]
