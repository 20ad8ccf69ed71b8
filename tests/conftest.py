"""Shared test configuration: each real service has its own fixture module."""

import gc
import os
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.signing",
    "tests.fixtures.slurm",
    "tests.fixtures.platform",
    "tests.fixtures.instance",
    "tests.fixtures.worker",
]


def pytest_configure(config) -> None:
    # The suite's training runs share two cores with the servers, the Slurm cluster and the other worker's runs.
    # Torch's OpenMP threads spin between parallel regions (GNU OpenMP's default): a run paced by the clock, or
    # waiting on slow data or a collective, then holds a whole core doing nothing (measured: 2000 steps paced at
    # 5 ms took 12.8 s of CPU spinning, 1.3 s passive). Passive threads sleep instead; no result changes (the same
    # threads do the same work). Set before anything here or in the processes the tests start loads OpenMP; a
    # developer's own setting is kept. Jobs inherit it (launch/job_env.py passes OMP_*).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Dagster runs in this process too (materialize), and the platform servers the tests start inherit its
    # signal dispositions: the same reasons as for `tp` (training_platform/cli/main.py).
    from training_platform.cli.main import keep_stop_signals_deliverable

    keep_stop_signals_deliverable()
    # Every spec must name a declared team (training_platform/policy/teams.py): the tests' teams, whatever
    # the developer's own TP_TEAMS says. A test of the teams file itself sets or removes it.
    os.environ["TP_TEAMS"] = str(Path(__file__).parent / "fixtures" / "teams.yaml")
    if config.pluginmanager.hasplugin("xdist"):
        from tests.fixtures.worker_groups import ModuleGroupsOnOneWorker

        config.pluginmanager.register(ModuleGroupsOnOneWorker())


@pytest.fixture(autouse=True, scope="session")
def _own_config_home(tmp_path_factory):
    """`tp login` and a server's first admin save tokens under $XDG_CONFIG_HOME (client/credentials.py): the suite's
    go to a directory of its own, never to the developer's ~/.config."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture(autouse=True, scope="module")
def _no_stale_dagster_state():
    """Each test module starts with no current Dagster state storage.

    An instance entered twice (a test's `with` instance, then a schedule or sensor context built on it)
    leaves its storage current after it is disposed, and every later materialize() or validate_loadable()
    in this process then fails with "Attempted to resolve undefined DagsterInstance weakref".
    """
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    gc.collect()  # contexts left open are finalized now, not in the middle of the next module
    with set_defs_state_storage(None):
        yield
