"""A job the engine keeps through a preemption: moved to on-demand when due, then released from the hold."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from training_platform.launch import JobHandle, JobState, JobStatus
from training_platform.recovery.preemption import Progress, deadline_risk, fallback_reason, summarize
from training_platform.recovery.requeue import follow_requeued
from training_platform.runs.events import MOVED_TO_ON_DEMAND, RunEvents
from training_platform.spec import parse_spec

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def _spec(spot: bool = True, deadline: datetime | None = None, **preemption):
    return parse_spec(
        {
            "name": "r",
            "team": "t",
            "owner": "o",
            "resources": {"spot": spot},
            "training": {"max_steps": 10_000},
            "preemption": preemption,
            "cost": {"deadline": deadline.isoformat() if deadline else None},
        }
    )


def _preempted_twice() -> list[dict]:
    """Two preemptions, each 60 s from the signal to the next first step, no step lost."""
    events = [{"kind": "started", "at": 0.0}, {"kind": "first_step", "at": 1.0}]
    for at in (100.0, 300.0):
        events += [
            {"kind": "preempted", "at": at, "step": int(at), "signal_at": at},
            {"kind": "started", "at": at + 30},
            {"kind": "resumed", "at": at + 40, "step": int(at)},
            {"kind": "first_step", "at": at + 60},
        ]
    return events


def test_a_deadline_is_at_risk_when_the_remaining_steps_do_not_fit_at_the_measured_pace():
    spec = _spec(deadline=NOW + timedelta(hours=1))
    slow = Progress(step=1000, steps_per_second=1.0, elapsed_s=600)  # 9000 s left
    fast = Progress(step=1000, steps_per_second=10.0, elapsed_s=600)  # 900 s left
    assert "deadline at risk: 150 min of training left at 1.0 steps/s" in deadline_risk(spec, slow, summarize([]), NOW)
    assert deadline_risk(spec, fast, summarize([]), NOW) is None
    assert deadline_risk(_spec(), slow, summarize([]), NOW) is None  # no deadline
    assert deadline_risk(spec, None, summarize([]), NOW) is None  # no pace measured yet


def test_expected_preemption_losses_count_against_the_deadline():
    # 900 s of training left; 2 preemptions in 600 s -> 3 more expected, 60 s each: 1080 s needed.
    fast = Progress(step=1000, steps_per_second=10.0, elapsed_s=600)
    history = summarize(_preempted_twice())
    assert deadline_risk(_spec(deadline=NOW + timedelta(seconds=1000)), fast, summarize([]), NOW) is None
    risk = deadline_risk(_spec(deadline=NOW + timedelta(seconds=1000)), fast, history, NOW)
    assert risk is not None and "plus 3 min expected preemption losses" in risk
    assert deadline_risk(_spec(deadline=NOW + timedelta(seconds=1100)), fast, history, NOW) is None


def test_fallback_after_n_preemptions_or_a_deadline_at_risk_and_only_for_spot():
    spot = _spec(fallback_to_ondemand_after=2)
    assert fallback_reason(spot, 1) is None
    assert "2 preemptions on spot >= preemption.fallback_to_ondemand_after" in fallback_reason(spot, 2)
    assert fallback_reason(spot, 1, "deadline at risk: ...") == "deadline at risk: ..."
    assert fallback_reason(_spec(spot=False), 5, "deadline at risk: ...") is None


class RecordingLauncher:
    name = "fake"

    def __init__(self, movable: bool = True):
        self.calls: list[str] = []
        self.movable = movable

    def move_to_on_demand(self, handle, spec):
        self.calls.append("move")
        return "moved to on-demand" if self.movable else None

    def release_requeue_hold(self, handle):
        self.calls.append("release")
        return "released"


HANDLE = JobHandle("fake", "42", "r")


@pytest.mark.parametrize("movable", [True, False])
def test_a_due_job_is_moved_once_and_before_it_is_released(tmp_path, movable):
    launcher = RecordingLauncher(movable)
    requeued = JobStatus(JobState.REQUEUED, "requeued", preemptions=2)
    spec = _spec(fallback_to_ondemand_after=2)

    first = follow_requeued(launcher, HANDLE, spec, tmp_path, requeued)
    second = follow_requeued(launcher, HANDLE, spec, tmp_path, requeued)
    assert second == ["released"]

    moved = [e for e in RunEvents(tmp_path).read() if e["kind"] == MOVED_TO_ON_DEMAND]
    if movable:
        assert first[0].startswith("2 preemptions on spot") and first[1] == "released"
        assert launcher.calls == ["move", "release", "release"]  # moved once, released on every poll
        assert [e["job_id"] for e in moved] == ["42"]
    else:  # the backend could not move it (a job that is gone): asked again, nothing recorded
        assert launcher.calls == ["move", "release", "move", "release"] and moved == []


def test_a_job_not_due_or_not_waiting_is_only_released(tmp_path):
    launcher = RecordingLauncher()
    spec = _spec(fallback_to_ondemand_after=3)
    requeued, running = JobStatus(JobState.REQUEUED, "", preemptions=5), JobStatus(JobState.RUNNING, "", preemptions=5)
    assert follow_requeued(launcher, HANDLE, spec, tmp_path, replace(requeued, preemptions=1)) == ["released"]
    assert follow_requeued(launcher, HANDLE, spec, tmp_path, running) == []
    assert follow_requeued(launcher, HANDLE, _spec(spot=False), tmp_path, requeued) == ["released"]
    assert launcher.calls == ["release", "release"]


def test_a_job_requeued_at_its_time_limit_stays_on_spot(tmp_path):
    """Slurm counts the time limit's requeue as a restart; the run's log says it was no preemption."""
    launcher = RecordingLauncher()
    events = RunEvents(tmp_path)
    events.append("started")
    events.append("preempted", step=40)
    requeued = JobStatus(JobState.REQUEUED, "", preemptions=1, restarts=1)
    spec = _spec(fallback_to_ondemand_after=1)
    assert follow_requeued(launcher, HANDLE, spec, tmp_path, requeued)[0].startswith("1 preemptions on spot")

    launcher, other = RecordingLauncher(), tmp_path / "time-limit"
    other.mkdir()
    for kind, fields in (("started", {}), ("preempted", {"step": 40}), ("time_limit", {"job_id": "42"})):
        RunEvents(other).append(kind, **fields)
    assert follow_requeued(launcher, HANDLE, spec, other, requeued) == ["released"]
    assert launcher.calls == ["release"]
