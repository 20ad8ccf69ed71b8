"""The platform's shared records (sweeps and runs waiting for their window) in the home and in the platform's
database: the same answers, whole records only, names checked on the way in, and a lock that holds across
processes. SQLite here; the team stack's sweep takes the PostgreSQL advisory lock."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta

import pytest

from training_platform.cost.run_windows import RunWindowQueue
from training_platform.cost.windows import CostWindow
from training_platform.errors import SharedStateError, SpecError
from training_platform.spec import parse_spec
from training_platform.state.backends import open_documents
from training_platform.state.documents import FileDocuments
from training_platform.state.documents_db import DatabaseDocuments
from training_platform.sweeps import parse_sweep
from training_platform.sweeps.queue import SweepQueue


@pytest.fixture(params=["file", "database"])
def home_root(request, tmp_path, monkeypatch):
    if request.param == "database":
        monkeypatch.setenv("TP_DATABASE_URL", f"sqlite:///{tmp_path / 'platform.db'}")
    else:
        monkeypatch.delenv("TP_DATABASE_URL", raising=False)
    return tmp_path / "home"


def test_the_setting_picks_where_records_are(home_root):
    records = open_documents(home_root, "sweep", "sweeps/queue")
    records.put("s1", {"state": "QUEUED"})
    in_database = isinstance(records, DatabaseDocuments)
    assert in_database != isinstance(records, FileDocuments)
    assert (home_root / "sweeps" / "queue" / "s1.json").is_file() != in_database


def test_records_are_replaced_whole_and_kept_apart_by_kind(home_root):
    sweeps, windows = open_documents(home_root, "sweep", "sweeps/queue"), open_documents(home_root, "run_window", "w")
    assert sweeps.get("a") is None and sweeps.names() == []
    sweeps.put("b", {"state": "QUEUED", "n": 1})
    sweeps.put("a", {"state": "QUEUED"})
    sweeps.put("b", {"state": "RUNNING"})
    windows.put("b", {"spec": {}})
    assert sweeps.get("b") == {"state": "RUNNING"} and sweeps.names() == ["a", "b"]
    assert windows.names() == ["b"] and windows.get("b") == {"spec": {}}


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "", "x\n"])
def test_names_are_checked_on_the_way_in(home_root, name):
    records = open_documents(home_root, "sweep", "sweeps/queue")
    for call in (lambda: records.get(name), lambda: records.put(name, {}), lambda: records.locked(name).__enter__()):
        with pytest.raises(SpecError, match="sweep name .* is not allowed"):
            call()


def _increment(home_root, url: str | None, times: int, barrier) -> None:
    import os

    if url:
        os.environ["TP_DATABASE_URL"] = url
    records = open_documents(home_root, "sweep", "sweeps/queue")
    barrier.wait()
    for _ in range(times):
        with records.locked("counter"):
            records.put("counter", {"n": records.get("counter")["n"] + 1})


def test_the_lock_keeps_read_modify_write_whole_across_processes(home_root):
    import os

    records = open_documents(home_root, "sweep", "sweeps/queue")
    records.put("counter", {"n": 0})
    context = multiprocessing.get_context("spawn")  # fresh processes, as on other machines
    barrier = context.Barrier(3)
    workers = [
        context.Process(target=_increment, args=(home_root, os.environ.get("TP_DATABASE_URL"), 25, barrier))
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert records.get("counter") == {"n": 75}


def test_the_queues_read_and_write_through_the_records(home_root):
    base = {"name": "b", "team": "vision", "owner": "me"}
    space = {"training.learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}}
    sweep = parse_sweep({"name": "s1", "base": base, "search_space": space})
    start = datetime(2026, 11, 27, 2, tzinfo=UTC)
    window = CostWindow(start, start + timedelta(hours=2), 1.0, 2.0, 1.0, 1, None, True, "us-east-1")
    queue = SweepQueue(home_root)
    assert queue.enqueue(sweep, window).state == "QUEUED"
    queue.start(sweep, "parent-1")
    assert (queue.get("s1").state, queue.get("s1").parent_mlflow_run_id) == ("RUNNING", "parent-1")
    queue.mark("s1", "FINISHED")
    assert [q.state for q in queue.all()] == ["FINISHED"]
    waiting = RunWindowQueue(home_root)
    waiting.enqueue("r-1", parse_spec(base), {"team": "vision"}, window)
    assert [w.run_id for w in waiting.due(start)] == ["r-1"] and waiting.due(start - timedelta(hours=1)) == []


def test_an_unreachable_database_is_named_without_its_password(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_DATABASE_URL", "postgresql+psycopg2://tp:s3cret-pw@127.0.0.1:1/platform")
    with pytest.raises(SharedStateError, match=r"sweep records in the platform's database .*127\.0\.0\.1:1") as caught:
        SweepQueue(tmp_path).all()
    assert "s3cret-pw" not in str(caught.value)


def test_a_shared_lock_takes_any_key(home_root):
    from training_platform.state.backends import shared_lock

    with shared_lock(home_root, "registry", "vision/digits classifier: v2"):
        pass  # a model's name is any text; the lock is named by its hash
