"""A run's attempts, read from its event log (runs/events.py): when each held compute, how it ended, what it kept.

An attempt is one start of the worker (a `started` event): the first launch, a requeue by the engine
(Slurm --requeue, Kueue), a resume or retry run, a torchrun restart after a rank died. A job that
ended before its worker started is an attempt too: it held its allocation until it ended.

Its wall time is the time its job held an allocation: from when the orchestrator first saw the job
running (`job_running`, else the worker's start) to when it saw the job end (`job_ended`); a requeued
job's next attempt starts when it runs again (`job_running` with `again`), ending the previous attempt
at its last event, so the time a job waits in the queue is not charged; a restart by torchrun within the
allocation ends the previous attempt when the next one starts, so the restart is that attempt's cost.

An attempt is closed, and its figures final, at the first of those ends (or when another job is
submitted for the run). Each fixes the end time from events already written, so whoever reads the log
first (the training asset, the preemption sensor) prices the attempt the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training_platform.runs.events import MOVED_TO_ON_DEMAND

# How the orchestrator's `job_ended` states read as an attempt's outcome.
OUTCOMES = {"SUCCEEDED": "succeeded", "PREEMPTED": "preempted", "FAILED": "failed", "CANCELLED": "cancelled"}
STEP_EVENTS = ("progress", "checkpoint", "preempted", "finished", "pruned")


@dataclass(frozen=True)
class AttemptSpan:
    number: int  # 1-based, in the order the attempts started; stable as the log only grows
    started_at: float  # when its job was seen holding its allocation (else the worker's start)
    ended_at: float | None  # None: still open, not charged yet
    outcome: str  # succeeded, preempted, failed, cancelled, killed (no notice), running
    start_step: int  # the step it resumed from (0 for a fresh start)
    step_reached: int
    kept_step: int  # the newest step a successor can resume from: its last checkpoint, else its start
    stepping_seconds: float  # from its first step to the last step it reported
    spot: bool | None  # the capacity its job ran on (None: not recorded by the launcher)
    dagster_run_id: str | None

    @property
    def closed(self) -> bool:
        return self.ended_at is not None

    @property
    def wall_seconds(self) -> float:
        return max((self.ended_at or self.started_at) - self.started_at, 0.0)

    @property
    def steps(self) -> int:
        return max(self.step_reached - self.start_step, 0)

    @property
    def lost_steps(self) -> int:
        """Steps computed and thrown away: a successor redoes everything after the newest checkpoint."""
        if self.outcome == "succeeded":
            return 0
        return max(self.step_reached - max(self.kept_step, self.start_step), 0)

    @property
    def lost_seconds(self) -> float:
        return self.stepping_seconds * self.lost_steps / self.steps if self.steps else 0.0

    @property
    def useful_seconds(self) -> float:
        """Time spent on steps that were kept: the effective training time of this attempt."""
        return max(self.stepping_seconds - self.lost_seconds, 0.0) if self.steps else 0.0


@dataclass
class _Open:
    """An attempt being read."""

    started_at: float
    spot: bool | None
    dagster_run_id: str | None
    last_at: float
    start_step: int = 0
    step_reached: int = 0
    kept_step: int = 0
    first_step_at: float | None = None
    last_step_at: float | None = None
    preempted: bool = False

    def read(self, event: dict[str, Any]) -> None:
        kind, at = event["kind"], event["at"]
        self.last_at = max(self.last_at, at)
        if kind == "resumed":
            self.start_step = self.step_reached = self.kept_step = int(event["step"])
        elif kind == "first_step":
            self.first_step_at = at
        if kind in STEP_EVENTS and "step" in event:
            self.step_reached = max(self.step_reached, int(event["step"]))
            self.last_step_at = at
        if kind == "checkpoint":
            self.kept_step = max(self.kept_step, int(event["step"]))
        self.preempted = self.preempted or kind == "preempted"

    def close(self, number: int, ended_at: float | None, outcome: str) -> AttemptSpan:
        stepping = 0.0
        if self.first_step_at is not None and self.last_step_at is not None:
            stepping = max(self.last_step_at - self.first_step_at, 0.0)
        return AttemptSpan(
            number=number,
            started_at=self.started_at,
            ended_at=ended_at,
            outcome=outcome,
            start_step=self.start_step,
            step_reached=self.step_reached,
            kept_step=self.kept_step,
            stepping_seconds=stepping,
            spot=self.spot,
            dagster_run_id=self.dagster_run_id,
        )


def attempt_spans(events: list[dict[str, Any]]) -> list[AttemptSpan]:
    """Every attempt of a run in order, closed ones first to last, then the open one if any."""
    spans: list[AttemptSpan] = []
    current: _Open | None = None
    job: dict[str, Any] | None = None  # the newest submitted job: its capacity, run and whether it started

    def close(ended_at: float | None, outcome: str) -> None:
        nonlocal current
        assert current is not None
        spans.append(current.close(len(spans) + 1, ended_at, outcome))
        current = None

    for event in events:
        kind = event["kind"]
        if kind == "submitted":
            if current is not None:  # the orchestrator lost the previous job without seeing it end
                close(current.last_at, "killed")
            job = {"at": event["at"], "spot": event.get("spot"), "run": event.get("dagster_run_id"), "open": True,
                   "running_at": None}
        elif kind == MOVED_TO_ON_DEMAND and job is not None:  # later attempts run on-demand
            job["spot"] = False
        elif kind == "job_running" and job is not None:
            if current is not None and event.get("again"):  # requeued: the old allocation ended with its events
                close(current.last_at, "preempted" if current.preempted else "killed")
            if current is None:
                job["running_at"] = event["at"]
        elif kind == "started":
            if current is not None:  # restarted by torchrun (or requeued unseen): held until this start
                close(event["at"], "preempted" if current.preempted else "killed")
            spot, run = (job["spot"], job["run"]) if job else (None, None)
            held_from = job["running_at"] if job and job["running_at"] is not None else event["at"]
            current = _Open(started_at=held_from, spot=spot, dagster_run_id=run, last_at=event["at"])
            if job:
                job["open"], job["running_at"] = False, None
        elif kind == "job_ended":
            outcome = OUTCOMES.get(event.get("state", ""), "failed")
            if current is not None:
                close(event["at"], outcome)
            elif job is not None and job["open"]:  # the job ended before its worker started
                held_from = job["running_at"] if job["running_at"] is not None else event["at"]  # never ran: $0
                unstarted = _Open(started_at=held_from, spot=job["spot"], dagster_run_id=job["run"], last_at=held_from)
                spans.append(unstarted.close(len(spans) + 1, event["at"], outcome))
            if job is not None:
                job["open"] = False
        elif current is not None:
            current.read(event)
    if current is not None:
        spans.append(current.close(len(spans) + 1, None, "running"))
    return spans


def resume_step(events: list[dict[str, Any]]) -> int:
    """The step the next attempt is expected to resume from: the newest checkpoint the log records."""
    return max((int(e["step"]) for e in events if e["kind"] in ("checkpoint", "resumed") and "step" in e), default=0)
