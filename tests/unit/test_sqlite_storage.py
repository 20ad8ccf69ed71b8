"""The server's SQLite run and schedule storage (training_platform_dagster/sqlite_storage.py): Dagster's files and
schema, with one connection kept open per process instead of a new engine and connection at every use."""

import multiprocessing
import os
import threading

import dagster as dg
import pytest
import sqlalchemy
from dagster._core.scheduler.instigation import InstigatorType

from training_platform.server import DATABASE_ENV, instance_config
from training_platform.shipped import INSTANCE_CONFIG
from training_platform_dagster.sqlite_storage import RunStorage, ScheduleStorage


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    return tmp_path


def _run(instance: dg.DagsterInstance, job_name: str) -> str:
    run = instance.create_run_for_job(dg.GraphDefinition(name="noop").to_job(name=job_name))
    return run.run_id


def test_a_home_that_dagsters_default_storage_wrote_is_read_after_the_upgrade(dagster_home):
    """A home started by an earlier `tp` (Dagster's default SQLite storage) keeps its runs and sensor states."""
    (dagster_home / "dagster.yaml").write_text(INSTANCE_CONFIG.read_text())
    with dg.DagsterInstance.from_config(str(dagster_home)) as before:
        assert type(before.run_storage) is not RunStorage
        run_id = _run(before, "before_upgrade")
        before.add_dynamic_partitions("days", ["2026-12-01"])
        states_before = {state.selector_id for state in before.all_instigator_state()}

    (dagster_home / "dagster.yaml").write_text(instance_config())
    with dg.DagsterInstance.from_config(str(dagster_home)) as after:
        assert type(after.run_storage) is RunStorage
        assert type(after.schedule_storage) is ScheduleStorage
        assert after.get_run_by_id(run_id).job_name == "before_upgrade"
        assert after.get_dynamic_partitions("days") == ["2026-12-01"]
        assert {state.selector_id for state in after.all_instigator_state()} == states_before
    assert {path.name for path in (dagster_home / "history").glob("*.db")} == {"runs.db"}
    assert {path.name for path in (dagster_home / "schedules").glob("*.db")} == {"schedules.db"}


def _opened_connections(engine: sqlalchemy.engine.Engine) -> list[int]:
    opened: list[int] = []
    sqlalchemy.event.listen(engine, "connect", lambda *_: opened.append(os.getpid()))
    return opened


def test_a_process_keeps_one_connection_across_uses(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config())
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for storage in (instance.run_storage, instance.schedule_storage):
            opened = _opened_connections(storage._engine())
            for _ in range(20):
                instance.get_runs(limit=5)
                instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
            assert len(opened) <= 1  # Dagster's connect opens one at each of the 20 uses


def test_threads_that_use_the_storage_at_once_each_get_a_connection(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config())
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        storage = instance.run_storage
        inside = threading.Barrier(2, timeout=30)
        failures: list[BaseException] = []

        def hold_a_connection() -> None:
            try:
                with storage.connect() as conn:
                    inside.wait()  # both threads hold a connection at the same time
                    conn.execute(sqlalchemy.text("select count(*) from runs")).scalar()
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=hold_a_connection) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures
        assert storage._engine().pool.checkedout() == 0


def _write_in_a_child(storage: RunStorage, queue: "multiprocessing.Queue[object]") -> None:
    opened = _opened_connections(storage._engine())
    storage.set_cursor_values({"written_by": "child"})
    queue.put(opened)


def test_a_child_of_a_fork_opens_its_own_connection_and_the_parents_still_works(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config())
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        storage = instance.run_storage
        storage.set_cursor_values({"written_by": "parent"})  # the parent's connection is open when it forks
        parent_engine = storage._engine()
        fork = multiprocessing.get_context("fork")
        queue = fork.Queue()
        child = fork.Process(target=_write_in_a_child, args=(storage, queue))
        child.start()
        opened_in_child = queue.get(timeout=60)
        child.join(timeout=60)
        assert child.exitcode == 0
        assert opened_in_child == [child.pid]  # a connection of its own, opened in the child
        assert storage._engine() is parent_engine
        assert storage.get_cursor_values({"written_by"}) == {"written_by": "child"}
