"""Dagster assets: thin wrappers that call the training_platform core library.

Lineage reads left to right:
dataset_snapshot -> training_run -> checkpoints -> evaluated_model -> registered_model
"""

from assets.alerts import ALERT_CHECKS
from assets.checkpoints import checkpoints
from assets.datasets import daily_snapshots, dataset_snapshot
from assets.lifecycle import checkpoint_lifecycle_job, checkpoint_storage
from assets.models import evaluated_model, registered_model
from assets.partitions import training_runs
from assets.sweeps import sweep, sweep_job
from assets.training import training_run

ALL_ASSETS = [dataset_snapshot, training_run, checkpoints, evaluated_model, registered_model]
ALL_CHECKS = [*ALERT_CHECKS]  # dataset_snapshot's expectations run inside the (daily partitioned) asset
SWEEP_ASSETS = [sweep]  # own partitions (`sweeps`): kept out of ALL_ASSETS, which the CLI materializes by run
STORAGE_ASSETS = [checkpoint_storage]  # not per run: the whole home's stores, on a schedule

__all__ = [
    "ALL_ASSETS",
    "ALL_CHECKS",
    "STORAGE_ASSETS",
    "SWEEP_ASSETS",
    "checkpoint_lifecycle_job",
    "daily_snapshots",
    "sweep_job",
    "training_runs",
]
