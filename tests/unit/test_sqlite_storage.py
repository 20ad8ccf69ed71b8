"""The server's SQLite run, event-log and schedule storage (training_platform_dagster/sqlite_storage.py): Dagster's
files and schema, with connections kept open per process instead of a new engine and connection at every use."""

import multiprocessing
import os
import threading
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy
from dagster._core.scheduler.instigation import InstigatorType
from dagster._core.storage.event_log import SqliteEventLogStorage

from training_platform.server.local import DATABASE_ENV, instance_config
from training_platform.shipped import INSTANCE_CONFIG
from training_platform_dagster.sqlite_storage import KEPT_RUN_FILES, EventLogStorage, RunStorage, ScheduleStorage


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "another home"))  # an instance opened from its own directory
    home = tmp_path / "home"
    home.mkdir()
    return home


def _run(instance: dg.DagsterInstance, job_name: str) -> str:
    run = instance.create_run_for_job(dg.GraphDefinition(name="noop").to_job(name=job_name))
    instance.report_engine_event(f"{job_name} started", run)
    return run.run_id


def _messages(storage, run_id: str) -> list[str]:
    return [entry.message for entry in storage.get_logs_for_run(run_id)]


def test_a_home_that_dagsters_default_storage_wrote_is_read_after_the_upgrade(dagster_home):
    """A home started by an earlier `tp` (Dagster's default SQLite storage) keeps its runs and sensor states."""
    (dagster_home / "dagster.yaml").write_text(INSTANCE_CONFIG.read_text())
    with dg.DagsterInstance.from_config(str(dagster_home)) as before:
        assert type(before.run_storage) is not RunStorage
        run_id = _run(before, "before_upgrade")
        before.add_dynamic_partitions("days", ["2026-12-01"])
        states_before = {state.selector_id for state in before.all_instigator_state()}

    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
    with dg.DagsterInstance.from_config(str(dagster_home)) as after:
        assert type(after.run_storage) is RunStorage
        assert type(after.schedule_storage) is ScheduleStorage
        assert type(after.event_log_storage) is EventLogStorage
        assert after.get_run_by_id(run_id).job_name == "before_upgrade"
        assert "before_upgrade started" in _messages(after.event_log_storage, run_id)
        assert after.get_dynamic_partitions("days") == ["2026-12-01"]
        assert {state.selector_id for state in after.all_instigator_state()} == states_before
    assert {path.name for path in (dagster_home / "history").glob("*.db")} == {"runs.db"}
    assert {path.name for path in (dagster_home / "history" / "runs").glob("*.db")} == {"index.db", f"{run_id}.db"}
    assert {path.name for path in (dagster_home / "schedules").glob("*.db")} == {"schedules.db"}


def _opened_connections(engine: sqlalchemy.engine.Engine) -> list[int]:
    opened: list[int] = []
    sqlalchemy.event.listen(engine, "connect", lambda *_: opened.append(os.getpid()))
    return opened


def test_a_process_keeps_one_connection_across_uses(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        run_id = _run(instance, "kept")
        engines = [storage._engine() for storage in (instance.run_storage, instance.schedule_storage)]
        event_log = instance.event_log_storage
        engines += [event_log._kept_runs.get(event_log.conn_string_for_shard(run_id))]
        opened = [_opened_connections(engine) for engine in engines]
        for _ in range(20):
            instance.get_runs(limit=5)
            instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
            instance.report_engine_event("a step", instance.get_run_by_id(run_id))
        assert [len(each) for each in opened] == [0, 0, 0]  # Dagster's connect opens one at each of the 20 uses
        assert _messages(instance.event_log_storage, run_id).count("a step") == 20


def _open_event_log_files() -> set[str]:
    fds = Path("/proc/self/fd")
    targets = {os.readlink(fd) for fd in fds.iterdir() if fd.name.isdigit() and fds.joinpath(fd.name).exists()}
    return {target for target in targets if target.endswith(".db") and "/history/runs/" in target}


def test_the_event_log_keeps_the_index_and_the_run_files_used_last_open(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        run_ids = [_run(instance, f"job_{index}") for index in range(KEPT_RUN_FILES + 4)]
        open_files = _open_event_log_files()
        assert str(dagster_home / "history" / "runs" / "index.db") in open_files
        assert len(open_files) == KEPT_RUN_FILES + 1
        assert {Path(path).stem for path in open_files} - {"index"} == set(run_ids[-KEPT_RUN_FILES:])
        assert "job_0 started" in _messages(instance.event_log_storage, run_ids[0])  # a file closed opens again
    assert _open_event_log_files() == set()  # closing the instance closes them


def test_after_a_wipe_events_go_to_the_new_files_not_the_deleted_ones(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        run_id = _run(instance, "wiped")
        instance.event_log_storage.wipe()
        instance.report_engine_event("after the wipe", instance.get_run_by_id(run_id))
    dagsters_own = SqliteEventLogStorage(str(dagster_home / "history" / "runs"))
    assert _messages(dagsters_own, run_id) == ["after the wipe"]


def test_threads_that_use_the_storage_at_once_each_get_a_connection(dagster_home):
    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
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
    (dagster_home / "dagster.yaml").write_text(instance_config(dagster_home))
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
