"""Imported by the code server's fork server after its modules (code_server.py): fills the caches every run's
process would otherwise fill anew, so that each run, a fork, starts with them.

What each registering run spent on them (py-spy of a warm server's run process, the digits example, 200 Hz):
MLflow's map of installed packages, read to check a model's requirements (`log_model`): 0.5 s; the environment's
lock, part of each run's lineage key: 0.4 s. And `mlflow.pytorch`, imported as the registry step imports it
(tracking.mlflow_pytorch: without its Lightning callback, the fork server's preload took 11.0 s of CPU instead of
12.6-13.6 s). Only reads: no thread, no file or connection left open that the forks would share.
"""

from __future__ import annotations

from mlflow.utils import requirements_utils

from training_platform.registry.tracking import mlflow_pytorch
from training_platform.runs.lineage import environment_lock

# Keyed by each import directory's modification time (runs/lineage.py): a distribution installed after the fork server
# started changes it, and a run then reads the environment anew.
environment_lock()
# Cached for the process's life, as in any process that registers a model: MLflow only warns from it.
requirements_utils._init_modules_to_packages_map()
mlflow_pytorch()
