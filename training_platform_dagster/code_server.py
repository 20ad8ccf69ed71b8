"""The platform's code server: Dagster's gRPC server (`dagster api grpc`), each run's process forked from a warm
fork server instead of started as a fresh interpreter.

Dagster starts every run in a process of its own through multiprocessing's "spawn": a new interpreter that imports
dagster and the definitions again before the run's first event, about a second and a half of each run's start on
two busy cores, and the daemon's queue waits for it (the launch returns once the process has loaded). Here the
context is "forkserver", preloaded with dagster, the instance's storage classes, the code location and the
libraries its steps use (torch, MLflow): a run's process is a fork of an interpreter that imported them already.
The fork server is a fresh interpreter that starts no Python thread (not a fork of this multi-threaded server), so
forking from it is safe, and each run's process gets the arguments spawn gave it.

    python -m training_platform_dagster.code_server -m definitions --socket PATH ...   (dagster api grpc's)

The fork server and its run processes stay in this process's group: stopping the group stops them too. What the
fork server imported is what runs use until the server restarts (`tp server stop`, then start): a change to the
platform's Dagster-side code reaches runs with the restart, as it reaches the code server itself. Training
processes are fresh interpreters either way.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing import forkserver
from typing import Any

from training_platform.launch.standby import HEAP_FREEZE, SHARED_OWNER_ENV

WARM_STARTS_ENV = "TP_WARM_STARTS"

WARM_MODULES = ["dagster", "dagster._grpc.impl", "dagster._core.execution.api", "upath.core"]
"""Imported by the fork server before any run; the code location's module is added from the command line. Dagster
imports universal-pathlib (`upath.core`) only as a run's process opens its instance."""

STEP_MODULES = [
    "torch",
    "torch.export._trace",
    "torch._inductor.ir",
    "mlflow",
    "mlflow.pyfunc",
    "mlflow.store.tracking.sqlalchemy_store",
    "git",
    "great_expectations",
    "great_expectations.expectations",
]
"""What the platform's steps import when they first need it, in every run's process: before the fork server imported
them, the registry step spent 6-8 s of each run importing `mlflow.pytorch` (torch, MLflow, torch.export), and the
snapshot step 3.3 s importing Great Expectations. Then, of each registering run (py-spy, two runs of the example):
`log_model` imported `torch.export`'s tracer (0.55 s) and its serializer's `torch._inductor.ir` (with it loaded, a
run's first registration takes 0.3 s of CPU instead of 0.8 s; it adds 0.05 s to the fork server's start), opening
the embedded default's SQLite tracking store imported MLflow's SQLAlchemy store (0.45 s), and MLflow's git lookup
imported GitPython; inferring the model's signature imported `mlflow.pyfunc` and the tracing it loads (0.3 s, with
Dagster's universal-pathlib). Only imported: the fork server runs no torch operation, so each run's process starts
torch's thread pools itself. `mlflow.pytorch` is not among them: WARM_CACHES imports it as the registry step does
(tracking.mlflow_pytorch, without Lightning)."""


WARM_CACHES = "training_platform_dagster.warm_caches"
"""Imported after the modules: fills what every run's process would fill anew (its docstring)."""


def _location_module(argv: list[str]) -> str | None:
    for flag in ("-m", "--module-name"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    return None


def instance_modules(dagster_home: str | None) -> list[str]:
    """The modules of the classes the instance is configured with (its storages, run launcher and coordinator).

    A run's process opens the instance first (`DagsterInstance.from_ref`), which imports them: for SQLite or
    PostgreSQL storage that is SQLAlchemy and Alembic, about 0.6 s of each run's start on two cores, unless the fork
    server imported them already. Only imported here: the fork server opens no storage, whose connections its
    children would share.
    """
    if not dagster_home:
        return []
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import ConfigurableClassData

    configured = InstanceRef.from_dir(dagster_home)._asdict().values()
    return sorted({data.module_name for data in configured if isinstance(data, ConfigurableClassData)})


def use_warm_processes(location_module: str | None, dagster_home: str | None) -> None:
    """Make every DagsterApiServer created from now on start runs from a fork server that preloaded dagster, the
    instance's storage classes, the location and what its steps import."""
    from dagster._grpc import server as grpc_server

    context = multiprocessing.get_context("forkserver")
    location = [location_module] if location_module else []
    preload = WARM_MODULES + instance_modules(dagster_home) + location + STEP_MODULES + [WARM_CACHES, HEAP_FREEZE]
    context.set_forkserver_preload(list(dict.fromkeys(preload)))
    original_init = grpc_server.DagsterApiServer.__init__

    def init(self, *args, **kwargs) -> None:
        original_init(self, *args, **kwargs)
        if not isinstance(getattr(self, "_mp_ctx", None), multiprocessing.context.BaseContext):
            # A Dagster upgrade that starts runs another way: fail loudly rather than silently go slow.
            raise RuntimeError(
                "this Dagster's gRPC server has no multiprocessing context to replace (_mp_ctx); "
                "update training_platform_dagster/code_server.py for it"
            )
        self._mp_ctx = context
        forkserver.ensure_running()  # now, with the location on sys.path: the first run does not wait for it

    grpc_server.DagsterApiServer.__init__ = init


@functools.cache
def _kept_open(cls: type) -> type:
    """CLS whose `with` block leaves the instance open: the server shares it for its life."""
    return type(cls.__name__, (cls,), {"__exit__": lambda self, *exc: None, "__module__": cls.__module__})


def share_instances() -> None:
    """Open the instance once in this process and share it, where Dagster opens it anew for every sensor and
    schedule tick (`DagsterInstance.from_ref`: its storages built and their schemas checked) and closes it after.

    An idle server ticks its sensors every few seconds: opening the instance was most of the code server's CPU at
    idle (measured: 5 % of a core; 1.7 % with one instance). One instance serves concurrent calls, as the
    webserver's and the daemon's do. Only in this process: each run's process is a fork of the fork server, which
    opened no instance, and opens its own.
    """
    from dagster import DagsterInstance
    from dagster._serdes import serialize_value

    open_anew = DagsterInstance.from_ref
    shared: dict[str, Any] = {}
    lock = threading.Lock()

    def from_ref(instance_ref: Any) -> Any:
        key = serialize_value(instance_ref)
        with lock:
            if key not in shared:
                instance = open_anew(instance_ref)
                instance.__class__ = _kept_open(type(instance))
                shared[key] = instance
            return shared[key]

    DagsterInstance.from_ref = staticmethod(from_ref)  # type: ignore[method-assign]


def start_shared_standby() -> None:
    """Start the shared standby now, for the import environment this server's runs get, rather than at the first
    run's submission: it loads at idle priority while the server starts, so the first run can start warm too."""
    from training_platform.launch import standby
    from training_platform.launch.job_env import job_environment
    from training_platform.paths import PlatformHome

    home = PlatformHome.from_env().root  # as the platform resource gives it to each run (TP_HOME)
    standby.spawn_shared(home, os.getpid(), {**job_environment(), "TP_HOME": str(home)})


def main() -> None:
    # `tp server stop` ends the server with SIGTERM to its group, which Dagster handles as it handles SIGINT. A
    # shell's background job starts with SIGINT ignored: then SIGTERM would be ignored too, here and in the fork
    # server (an ignored signal stays ignored across exec).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = sys.argv[1:]
    # Inherited by every run's process: the local launcher's training jobs start from a shared warm standby, which
    # leaves with this server (training_platform/launch/standby.py). TP_WARM_STARTS=0 turns it off (its memory).
    if os.environ.get(WARM_STARTS_ENV, "1") != "0":
        os.environ[SHARED_OWNER_ENV] = str(os.getpid())
        start_shared_standby()
    use_warm_processes(_location_module(argv), os.environ.get("DAGSTER_HOME"))
    share_instances()
    from dagster._cli import main as dagster_main

    sys.argv = ["dagster", "api", "grpc", *argv]
    dagster_main()


if __name__ == "__main__":
    main()
