"""`tp` follows a run whose Dagster run went down while its job went on into the run that takes the job over,
instead of reporting the run failed."""

from __future__ import annotations

import pytest

from training_platform.client import runs
from training_platform.client.graphql import DagsterRun
from training_platform.spec.submission import FOLLOW_TAG, LEFT_JOB_TAG, PARTITION_TAG, TRAINING_JOB


def _run(run_id: str, status: str, created: float, **tags: str) -> DagsterRun:
    return DagsterRun(run_id, TRAINING_JOB, status, {PARTITION_TAG: "r", **tags}, created)


class ScriptedServer:
    """The runs of platform run `r` as the server lists them after each poll."""

    url = "http://127.0.0.1:1"

    def __init__(self, timeline: list[list[DagsterRun]]):
        self.timeline = timeline

    def _now(self) -> list[DagsterRun]:
        return self.timeline[0]

    def run(self, dagster_run_id: str) -> DagsterRun | None:
        now = self._now()
        if len(self.timeline) > 1:
            self.timeline.pop(0)
        return next((r for r in now if r.id == dagster_run_id), None)

    def attempts(self, run_id: str) -> list[DagsterRun]:
        return list(self._now())

    def failure(self, dagster_run_id: str):
        raise AssertionError("a run whose job went on is not judged by its failure")

    def daemons_down(self) -> list[str]:
        return []


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch):
    monkeypatch.setattr(runs.time, "sleep", lambda _: None)


def test_a_run_that_went_down_is_followed_into_the_run_that_takes_its_job_over():
    first = _run("d1", "STARTED", 1.0)
    went_down = _run("d1", "FAILURE", 1.0, **{LEFT_JOB_TAG: "123"})
    taking_over = _run("d2", "STARTED", 2.0, **{FOLLOW_TAG: "d1"})
    server = ScriptedServer(
        [
            [first],
            [went_down],  # the sensor marked it failed; the run taking over is not created yet
            [went_down],
            [went_down, taking_over],
            [went_down, _run("d2", "SUCCESS", 2.0, **{FOLLOW_TAG: "d1"})],
        ]
    )
    phases = [(p.phase, p.dagster_run.id if p.dagster_run else None) for p in runs.follow(server, "r", "d1")]
    assert phases[0] == ("running", "d1")
    assert ("waiting for the run that takes over its job (the run went down, the job goes on)", "d1") in phases
    assert phases[-1] == ("SUCCEEDED", "d2")
