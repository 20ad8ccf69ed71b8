"""Who follows a run's job, read from its event log, and whether that follower's process is gone."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import psutil
import pytest

from training_platform.launch.following import Follower, newest_job


def _submitted(job_id: str, run: str, follower: Follower | None = None, **fields) -> dict:
    return {
        "kind": "submitted",
        "at": 1.0,
        "backend": "slurm",
        "job_id": job_id,
        "dagster_run_id": run,
        **(follower.fields() if follower else {}),
        **fields,
    }


def test_no_job_before_the_first_submission():
    assert newest_job("r", [{"kind": "registered", "at": 0.0}]) is None


def test_the_newest_job_its_submitter_and_mlflow_run():
    me = Follower.this_process()
    events = [
        _submitted("11", "dagster-1", me),
        {"kind": "job_ended", "at": 2.0, "state": "PREEMPTED"},
        _submitted("12", "dagster-2", me, mlflow_run_id="m2"),
        {"kind": "progress", "at": 3.0, "step": 5},
    ]
    job = newest_job("r", events)
    assert (job.handle.job_id, job.handle.run_id, job.submitted_by, job.followed_by) == (
        "12",
        "r",
        "dagster-2",
        "dagster-2",
    )
    assert job.mlflow_run_id == "m2" and job.follower == me
    assert job.unfollowed and job.left_behind


def test_a_run_that_takes_over_follows_the_job_until_its_end_is_recorded():
    other = Follower("elsewhere", 7, 1.0)
    events = [
        _submitted("12", "dagster-2", Follower.this_process()),
        {"kind": "followed", "at": 4.0, "job_id": "12", "dagster_run_id": "dagster-3", **other.fields()},
    ]
    job = newest_job("r", events)
    assert job.submitted_by == "dagster-2" and job.followed_by == "dagster-3" and job.follower == other
    ended = newest_job("r", [*events, {"kind": "job_ended", "at": 5.0, "state": "SUCCEEDED"}])
    assert ended.ended == "SUCCEEDED" and not ended.unfollowed and not ended.left_behind


def test_a_follow_of_an_older_job_does_not_count():
    events = [_submitted("12", "dagster-2"), {"kind": "followed", "at": 4.0, "job_id": "11", "dagster_run_id": "x"}]
    assert newest_job("r", events).followed_by == "dagster-2"


def test_a_job_submitted_before_followers_were_recorded_is_not_left_behind():
    job = newest_job("r", [_submitted("12", "dagster-2")])
    assert job.unfollowed and job.follower is None and not job.left_behind


def test_a_follower_is_gone_when_its_pid_ended_or_is_another_process():
    me = Follower.this_process()
    assert me.is_gone() is False
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert replace(me, pid=ended.pid).is_gone() is True
    boot, ticks = me.start_mark.split(":")
    assert replace(me, start_mark=f"{boot}:{int(ticks) - 100}").is_gone() is True  # the pid reused by a later process
    assert replace(me, host="another-host").is_gone() is None  # only Dagster can say
    # An event of an earlier version, with the start in seconds since the epoch only.
    assert replace(me, start_mark=None).is_gone() is False
    assert replace(me, start_mark=None, pid_started=me.pid_started - 60).is_gone() is True


def set_clock_ahead(monkeypatch, seconds: float) -> None:
    """The system clock set ahead (NTP, a virtual machine resumed): the boot time it implies moves with it."""
    booted = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted() + seconds)


def test_a_follower_is_not_gone_when_the_clock_is_set(monkeypatch):
    me = Follower.this_process()
    set_clock_ahead(monkeypatch, 5.0)
    assert psutil.Process().create_time() - me.pid_started == pytest.approx(5.0)  # what psutil says moved
    assert me.is_gone() is False


def test_a_follower_reads_back_from_its_event():
    me = Follower.this_process()
    assert Follower.from_event({"kind": "submitted", **me.fields()}) == me
    earlier = {key: value for key, value in me.fields().items() if key != "pid_start_mark"}
    assert Follower.from_event({"kind": "submitted", **earlier}) == replace(me, start_mark=None)
