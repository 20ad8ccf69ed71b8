"""The code server's fork server imports what a run's process needs before its first run: the instance's classes."""

from training_platform.server.local import DATABASE_ENV, instance_config
from training_platform_dagster.code_server import instance_modules


def test_the_shipped_instance_preloads_its_sqlite_storage_and_the_team_queue(tmp_path, monkeypatch):
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    (tmp_path / "dagster.yaml").write_text(instance_config(tmp_path))
    modules = instance_modules(str(tmp_path))
    assert "training_platform_dagster.sqlite_storage" in modules
    assert "training_platform_dagster.run_coordinator" in modules
    assert "training_platform_dagster.postgres_storage" not in modules


def test_an_instance_on_postgres_preloads_the_postgres_storage(tmp_path, monkeypatch):
    monkeypatch.setenv(DATABASE_ENV, "postgresql+psycopg2://tp:secret@127.0.0.1:1/tp")
    (tmp_path / "dagster.yaml").write_text(instance_config(tmp_path))
    modules = instance_modules(str(tmp_path))
    assert "training_platform_dagster.postgres_storage" in modules
    assert "training_platform_dagster.sqlite_storage" not in modules


def test_no_dagster_home_preloads_no_instance_classes():
    assert instance_modules(None) == []


def test_the_server_opens_an_instance_once_and_a_with_block_leaves_it_open(tmp_path, monkeypatch):
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from training_platform_dagster.code_server import share_instances

    monkeypatch.delenv(DATABASE_ENV, raising=False)
    monkeypatch.setattr(dg.DagsterInstance, "from_ref", dg.DagsterInstance.from_ref)  # restored after the test
    homes = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "dagster.yaml").write_text(instance_config(tmp_path / name))
        homes.append(InstanceRef.from_dir(str(tmp_path / name)))
    share_instances()

    with dg.DagsterInstance.from_ref(homes[0]) as first:  # as a sensor tick's context opens it
        first.add_dynamic_partitions("days", ["2026-12-01"])
    again = dg.DagsterInstance.from_ref(homes[0])
    assert again is first and isinstance(again, dg.DagsterInstance)
    assert again.get_dynamic_partitions("days") == ["2026-12-01"]  # still open after the `with`
    other = dg.DagsterInstance.from_ref(homes[1])
    assert other is not first and other.get_dynamic_partitions("days") == []


def test_the_fork_server_freezes_its_heap_after_all_it_preloads(monkeypatch):
    """Its forks (each run's process) never walk the preloaded objects in a collection (heap_freeze.py)."""
    from multiprocessing import forkserver

    from dagster._grpc import server as grpc_server

    from training_platform.launch.standby import HEAP_FREEZE
    from training_platform_dagster.code_server import WARM_CACHES, use_warm_processes

    # Both restored after the test: the server class it patches, the preload of this process's fork server.
    monkeypatch.setattr(grpc_server.DagsterApiServer, "__init__", grpc_server.DagsterApiServer.__init__)
    monkeypatch.setattr(forkserver._forkserver, "_preload_modules", forkserver._forkserver._preload_modules)
    use_warm_processes("definitions", None)
    preload = forkserver._forkserver._preload_modules
    assert preload[-2:] == [WARM_CACHES, HEAP_FREEZE]  # the caches filled by what the modules before them load
    assert {"dagster", "definitions", "torch", "mlflow", "great_expectations"} <= set(preload)


WARM_CACHES_READ = """
import sys
from importlib import metadata

import importlib_metadata

import training_platform_dagster.warm_caches
from mlflow.utils import requirements_utils
from training_platform.runs.lineage import environment_lock

# What a run's process, a fork of the fork server, would read again: nothing.
reads = []
metadata.distributions = lambda: reads.append("environment") or []
importlib_metadata.packages_distributions = lambda: reads.append("packages") or {}
sys.path[0] = sys.path[0] or "."  # the working directory by another name, as a run's process has it
environment_lock()
requirements_utils._init_packages_to_modules_map()
# The registry step's mlflow.pytorch is loaded, without Lightning (tracking.mlflow_pytorch).
print("mlflow.pytorch" in sys.modules, "pytorch_lightning" in sys.modules)
print(reads)
"""


def test_the_fork_servers_warm_caches_leave_a_run_nothing_to_read_again():
    """Its runs are forks: what the fork server read (the environment's lock, MLflow's package map) they keep."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", WARM_CACHES_READ], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-2:] == ["True False", "[]"]
