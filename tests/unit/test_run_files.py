"""A run's files pushed by the job's side and pulled into the Dagster side's run directory (run_files.py)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.fixtures.worker import wait_until
from training_platform.checkpoints.storage import LocalStorage
from training_platform.errors import SpecError
from training_platform.run_files import RunFilesPusher, pull
from training_platform.runlog import RunEvents


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
    pusher = RunFilesPusher(store, "r1", pod)
    assert pusher.push() == ["events.jsonl"]
    assert pull(store, "r1", dagster) == ["events.jsonl"]
    assert [e["kind"] for e in RunEvents(dagster).read()] == ["submitted", "progress"]

    with open(pod / "events.jsonl", "a") as log:  # the pod is in the middle of a line when it is pushed
        log.write(json.dumps({"kind": "progress", "at": 2.0, "step": 2}) + "\n" + '{"kind": "checkp')
    pusher.push()
    RunEvents(dagster).append("job_running", again=False)
    assert pull(store, "r1", dagster) == ["events.jsonl"]
    assert [e["kind"] for e in RunEvents(dagster).read()] == ["submitted", "progress", "job_running", "progress"]

    with open(pod / "events.jsonl", "a") as log:
        log.write('oint", "at": 3.0, "step": 2}\n')
    pusher.push()
    assert pull(store, "r1", dagster) == ["events.jsonl"]
    assert pull(store, "r1", dagster) == []  # nothing new: nothing appended twice
    events = RunEvents(dagster).read()
    assert [e["kind"] for e in events] == ["submitted", "progress", "job_running", "progress", "checkpoint"]
    assert events[-1] == {"kind": "checkpoint", "at": 3.0, "step": 2}


def test_whole_files_replace_the_local_copy_when_they_change(sides):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod)
    (pod / "preempted.json").write_text('{"step": 40}')
    pusher.push()
    assert pull(store, "r1", dagster) == ["preempted.json"]
    assert pull(store, "r1", dagster) == []
    (pod / "result.json").write_text('{"status": "SUCCEEDED", "final_step": 90}')
    assert pusher.push() == ["result.json"]
    assert pusher.push() == []  # unchanged files are not sent again
    assert pull(store, "r1", dagster) == ["result.json"]
    assert json.loads((dagster / "result.json").read_text())["final_step"] == 90
    assert not list(dagster.glob(".*.pulling"))


def test_the_background_pusher_sends_changes_and_its_close_sends_the_last(sides):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod).start(seconds=0.05)
    try:
        RunEvents(pod).append("progress", step=1)
        wait_until(lambda: pull(store, "r1", dagster), 30, "the first event pushed in the background")
        (pod / "result.json").write_text('{"status": "SUCCEEDED"}')
    finally:
        pusher.close()
    pull(store, "r1", dagster)
    assert (dagster / "result.json").read_text() == '{"status": "SUCCEEDED"}'


def _pull_many(store_root: str, dagster: str, times: int) -> None:
    for _ in range(times):
        pull(LocalStorage(store_root), "r1", Path(dagster))


def test_pullers_racing_never_append_a_line_twice(sides, tmp_path):
    pod, store, dagster = sides
    pusher = RunFilesPusher(store, "r1", pod)
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
    pull(store, "r1", dagster)
    assert [e["step"] for e in RunEvents(dagster).read()] == list(range(60))


def test_a_run_id_that_is_not_one_is_refused(sides):
    pod, store, dagster = sides
    with pytest.raises(SpecError, match="is not allowed"):
        pull(store, "../other-team", dagster)
