"""Asset jobs: what the UI, schedules and sensors launch."""

import dagster as dg

from assets.partitions import training_runs

RUN_ASSET_KEYS = ["training_run", "checkpoints", "evaluated_model", "registered_model"]

snapshot_job = dg.define_asset_job(
    "dataset_snapshot_job", selection=dg.AssetSelection.assets("dataset_snapshot"), description="Build a snapshot."
)
training_pipeline = dg.define_asset_job(
    "training_pipeline",
    selection=dg.AssetSelection.assets(*RUN_ASSET_KEYS),
    partitions_def=training_runs,
    description="Train, checkpoint, evaluate and register one run (a training_runs partition).",
)
