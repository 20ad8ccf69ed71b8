"""Dagster assets: thin wrappers that call the training_platform core library.

Lineage reads left to right:
dataset_snapshot -> training_run -> checkpoints -> evaluated_model -> registered_model
"""

from assets.checkpoints import checkpoints
from assets.datasets import dataset_snapshot, dataset_snapshot_expectations
from assets.models import evaluated_model, registered_model
from assets.partitions import training_runs
from assets.training import training_run

ALL_ASSETS = [dataset_snapshot, training_run, checkpoints, evaluated_model, registered_model]
ALL_CHECKS = [dataset_snapshot_expectations]
RUN_ASSETS = [training_run, checkpoints, evaluated_model, registered_model]

__all__ = ["ALL_ASSETS", "ALL_CHECKS", "RUN_ASSETS", "training_runs"]
