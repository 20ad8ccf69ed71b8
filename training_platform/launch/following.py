"""Which Dagster run follows a run's job, and whether that run is still there to follow it.

A job can outlive the Dagster run that submitted it: the run's process (which follows the job, and materializes
the partition when it ends) is killed by the OOM killer or a restart, or fails on an error of its own, while the
Slurm job, the Kubernetes Job or the local job's own session trains on. Each follower therefore records itself in
the run's event log (`submitted`, or `followed` when it took over a job another run submitted) with its host, its
pid and that pid's start time. From that:

- the preemption sensor tells a follower that is gone from one that is still waiting, and has a new run of the
  partition take the job over (sensors/preemption.py);
- a new run of the partition takes over a job nobody follows instead of training the run a second time beside it
  (resources/launcher.py).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

import psutil

from training_platform.launch import process_start
from training_platform.launch.base import JobHandle

SUBMITTED = "submitted"
FOLLOWED = "followed"
JOB_ENDED = "job_ended"


@dataclass(frozen=True)
class Follower:
    """A process following a job: gone once its pid has ended or belongs to another process."""

    host: str
    pid: int
    pid_started: float  # when it started, in seconds since the epoch (for people reading the event log)
    # When it started, as process_start.py marks it: None in an event written by an earlier version, which matched
    # `pid_started` instead (to a hundredth of a second: a slew of the clock made a follower look gone).
    start_mark: str | None = None

    @classmethod
    def this_process(cls) -> Follower:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, psutil.Process().create_time(), process_start.start_mark(pid))

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Follower | None:
        try:
            mark = event.get("pid_start_mark")
            return cls(str(event["host"]), int(event["pid"]), float(event["pid_started"]),
                       str(mark) if mark is not None else None)
        except (KeyError, TypeError, ValueError):
            return None  # recorded before followers were, or by hand

    def fields(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "pid_started": self.pid_started, "pid_start_mark": self.start_mark}

    def is_gone(self) -> bool | None:
        """Whether the follower's process has ended; None when it ran on another host (ask Dagster instead)."""
        if self.host != socket.gethostname():
            return None
        if self.start_mark is not None:  # a pid is reused: the same pid started at another time is another process
            return not process_start.is_same_process(self.pid, self.start_mark)
        try:
            return abs(psutil.Process(self.pid).create_time() - self.pid_started) > 0.01
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return None


@dataclass(frozen=True)
class FollowedJob:
    """A run's newest job, who submitted it, who follows it now and how it ended (if a follower saw it end)."""

    handle: JobHandle
    submitted_by: str  # the Dagster run that submitted it: the job's run files and resumes are tagged with it
    followed_by: str  # the Dagster run that follows it now (the submitter, or one that took it over)
    follower: Follower | None
    mlflow_run_id: str | None  # the MLflow run the job logs to
    ended: str | None  # the JobState value its follower recorded at its end

    @property
    def unfollowed(self) -> bool:
        """No follower saw the job end: it still runs, or ended while its follower was gone."""
        return self.ended is None

    @property
    def left_behind(self) -> bool:
        """Unfollowed, and submitted since followers recorded themselves: the sensors act on such jobs only (one
        submitted before is left to whoever materializes the run next)."""
        return self.unfollowed and self.follower is not None


def newest_job(run_id: str, events: list[dict[str, Any]]) -> FollowedJob | None:
    """The run's newest submitted job, from its event log; None before its first submission."""
    job: FollowedJob | None = None
    for event in events:
        kind = event["kind"]
        if kind == SUBMITTED:
            run = event.get("dagster_run_id", "")
            job = FollowedJob(
                handle=JobHandle(event["backend"], event["job_id"], run_id),
                submitted_by=run,
                followed_by=run,
                follower=Follower.from_event(event),
                mlflow_run_id=event.get("mlflow_run_id"),
                ended=None,
            )
        elif job is None:
            continue
        elif kind == FOLLOWED and event.get("job_id") == job.handle.job_id:
            job = replace(job, followed_by=event.get("dagster_run_id", ""), follower=Follower.from_event(event))
        elif kind == JOB_ENDED:
            job = replace(job, ended=event.get("state", ""))
    return job
