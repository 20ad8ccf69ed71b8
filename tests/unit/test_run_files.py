"""A run's files pushed by the job's side and pulled into the Dagster side's run directory (runs/remote_files.py)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.fixtures.worker import wait_until
from training_platform.checkpoints.storage import LocalStorage
from training_platform.errors import SpecError
from training_platform.runs.events import RunEvents
from training_platform.runs.remote_files import RunFilesPusher, pull


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, LocalStorage, Path]:
    """The pod's run dir, the store between the sides, and the Dagster side's run dir."""
    pod, dagster = tmp_path / "pod" / "r1", tmp_path / "dagster" / "r1"
    pod.mkdir(parents=True)
    dagster.mkdir(parents=True)
    return pod, LocalStorage(tmp_path / "store"), dagster


def test_growing_logs_arrive_by_whole_lines_beside_the_dagster_sides_own_events(sides):
    pod, store, dagster = sides
    RunEvents(dagster).append("submitted", backend="k8s")
    RunEvents(pod).append("progress", step=1)
    pusher = RunFilesPusher(store, "r1", pod, "a1")
    assert pusher.push() == ["events.jsonl"]
    assert pull(store, "r1", dagster, "a1") == ["events.jsonl"]
    assert [e["kind"] for e in RunEvents(dagster).read()] == ["submitted", "progress"]

    with open(pod / "events.jsonl", "a") as log:  # the pod is in the middle of a line when it is pushed
        log.write(json.dumps({"kind": "progress", "at": 2.0, "step": 2}) + "\n" + '{"kind": "checkp')
    pusher.push()
    RunEvents(dagster).append("job_running", again=False)
    assert pull(store, "r1", dagster, "a1") == ["events.jsonl"]
    assert [e["kind"] for e in RunEvents(dagster).read()] == ["submitted", "progress", "job_running", "progress"]

    with open(pod / "events.jsonl", "a") as log:
        log.write('oint", "at": 3.0, "step": 2}\n')
    pusher.push()
    assert pull(store, "r1", dagster, "a1") == ["events.jsonl"]
    assert pull(store, "r1", dagster, "a1") == []  # nothing new: nothing appended twice
    events = RunEvents(dagster).read()
    assert [e["kind"] for e in events] == ["submitted", "progress", "job_running", "progress", "checkpoint"]
    assert events[-1] == {"kind": "checkpoint", "at": 3.0, "step": 2}


def test_whole_files_replace_the_local_copy_when_they_change(sides):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod, "a1")
    (pod / "preempted.json").write_text('{"step": 40}')
    pusher.push()
    assert pull(store, "r1", dagster, "a1") == ["preempted.json"]
    assert pull(store, "r1", dagster, "a1") == []
    (pod / "result.json").write_text('{"status": "SUCCEEDED", "final_step": 90}')
    assert pusher.push() == ["result.json"]
    assert pusher.push() == []  # unchanged files are not sent again
    assert pull(store, "r1", dagster, "a1") == ["result.json"]
    assert json.loads((dagster / "result.json").read_text())["final_step"] == 90
    assert not list(dagster.glob(".*.pulling"))


def test_the_background_pusher_sends_changes_and_its_close_sends_the_last(sides):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod, "a1").start(seconds=0.05)
    try:
        RunEvents(pod).append("progress", step=1)
        wait_until(lambda: pull(store, "r1", dagster, "a1"), 30, "the first event pushed in the background")
        (pod / "result.json").write_text('{"status": "SUCCEEDED"}')
    finally:
        pusher.close()
    pull(store, "r1", dagster, "a1")
    assert (dagster / "result.json").read_text() == '{"status": "SUCCEEDED"}'


def _pull_many(store_root: str, dagster: str, times: int) -> None:
    for _ in range(times):
        pull(LocalStorage(store_root), "r1", Path(dagster), "a1")


def test_pullers_racing_never_append_a_line_twice(sides, tmp_path):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod, "a1")
    context = multiprocessing.get_context("spawn")
    pullers = [context.Process(target=_pull_many, args=(str(tmp_path / "store"), str(dagster), 40)) for _ in range(3)]
    for process in pullers:
        process.start()
    for step in range(60):
        RunEvents(pod).append("progress", step=step)
        pusher.push()
    for process in pullers:
        process.join(120)
        assert process.exitcode == 0
    pull(store, "r1", dagster, "a1")
    assert [e["step"] for e in RunEvents(dagster).read()] == list(range(60))


def test_a_run_id_that_is_not_one_is_refused(sides):
    pod, store, dagster = sides
    with pytest.raises(SpecError, match="is not allowed"):
        pull(store, "../other-team", dagster, "a1")


def test_a_resumed_run_keeps_its_whole_history_and_each_dagster_run_reads_only_its_own_messages(sides, tmp_path):
    first_pod, store, dagster = sides
    RunEvents(first_pod).append("progress", step=10)
    (first_pod / "pipes-messages.jsonl").write_text('{"method": "log", "params": {"message": "attempt 1"}}\n')
    (first_pod / "preempted.json").write_text('{"step": 10}')
    RunFilesPusher(store, "r1", first_pod, "a1").push()
    pull(store, "r1", dagster, "a1")

    second_pod = tmp_path / "pod2" / "r1"  # the requeued attempt: a new pod, an empty run directory
    second_pod.mkdir(parents=True)
    RunEvents(second_pod).append("progress", step=20)
    (second_pod / "pipes-messages.jsonl").write_text('{"method": "log", "params": {"message": "attempt 2"}}\n')
    (second_pod / "result.json").write_text('{"status": "SUCCEEDED", "final_step": 20}')
    RunFilesPusher(store, "r1", second_pod, "a2").push()
    assert pull(store, "r1", dagster, "a2") == ["events.jsonl", "pipes-messages.jsonl", "result.json"]
    assert [e["step"] for e in RunEvents(dagster).read()] == [10, 20]
    assert (dagster / "preempted.json").is_file() and (dagster / "result.json").is_file()

    fresh = tmp_path / "dagster-pod2" / "r1"  # the resume's Dagster run in a pod of its own: nothing local yet
    pull(store, "r1", fresh, "a2")
    assert [e["step"] for e in RunEvents(fresh).read()] == [10, 20]  # the history, oldest writer first
    assert "attempt 1" not in (fresh / "pipes-messages.jsonl").read_text()  # not the earlier session's messages
    assert "attempt 2" in (fresh / "pipes-messages.jsonl").read_text()
    assert not (fresh / "preempted.json").exists()  # an earlier Dagster run's marker is not this one's
    assert (fresh / "result.json").is_file()
