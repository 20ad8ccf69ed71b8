"""What preemptions cost a run, and what to do about the next one.

Accounting reads the run's event log (see runs/events.py). The policy reads like SkyPilot's
recovery strategies: each is a named decision with the sequence it tries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from training_platform.launch.base import JobState, JobStatus
from training_platform.runs.events import NODE_FAILURE, TIME_LIMIT
from training_platform.spec import TrainSpec
from training_platform.telemetry.records import read_telemetry


@dataclass(frozen=True)
class Interruption:
    """One attempt that ended without finishing: a preemption (SIGTERM), a kill without notice, a lost node or the
    scheduler's time limit."""

    at: float
    # "preempted" (checkpoint written on notice), "killed" (no notice), "node_failure" (a node was lost) or
    # "time_limit" (stopped with a checkpoint at the Slurm time limit, and requeued)
    kind: str
    step_reached: int
    resumed_step: int | None
    recovery_seconds: float | None

    @property
    def lost_steps(self) -> int | None:
        return None if self.resumed_step is None else max(0, self.step_reached - self.resumed_step)


# Interruptions that are not the capacity provider taking capacity back: they count toward neither
# `fallback_to_ondemand_after` nor `max_preemptions` (the deadline's estimate counts every kind).
NOT_PREEMPTIONS = (NODE_FAILURE, TIME_LIMIT)


@dataclass
class PreemptionSummary:
    interruptions: list[Interruption] = field(default_factory=list)
    attempts: int = 0
    finished: bool = False
    ended: str | None = None  # how the latest attempt ended, while no later one has started

    @property
    def preemptions(self) -> int:
        return sum(1 for i in self.interruptions if i.kind not in NOT_PREEMPTIONS)

    @property
    def other_interruptions(self) -> int:
        """Interruptions that are not preemptions, the latest attempt's end included before the next starts."""
        closed = sum(1 for i in self.interruptions if i.kind in NOT_PREEMPTIONS)
        return closed + (self.ended in NOT_PREEMPTIONS)

    def preemptions_with(self, status: JobStatus) -> int:
        """Preemptions by the event log and the launcher together. A launcher without accounting (Slurm) counts
        every requeue; the ones the log tells were not preemptions are taken off."""
        return max(self.preemptions, status.preemptions - self.other_interruptions)

    @property
    def lost_steps(self) -> int:
        return sum(i.lost_steps or 0 for i in self.interruptions)

    @property
    def recovery_seconds(self) -> list[float]:
        return [i.recovery_seconds for i in self.interruptions if i.recovery_seconds is not None]

    def metadata(self) -> dict[str, Any]:
        recoveries = sorted(self.recovery_seconds)
        return {
            "preemptions": self.preemptions,
            "lost_steps": self.lost_steps,
            "attempts": self.attempts,
            "recovery_seconds_median": recoveries[len(recoveries) // 2] if recoveries else 0.0,
            "interruptions": [asdict(i) | {"lost_steps": i.lost_steps} for i in self.interruptions],
        }


def summarize(events: list[dict[str, Any]]) -> PreemptionSummary:
    """Walk the event log attempt by attempt: each `started` after the first closes an interruption."""
    summary = PreemptionSummary()
    step_reached = 0
    ended: dict[str, Any] | None = None  # how the previous attempt ended, if it said so
    pending: dict[str, Any] | None = None  # an interruption waiting for its resume figures
    for event in events:
        kind = event["kind"]
        if kind == "started":
            summary.attempts += 1
            if summary.attempts > 1 and (ended is None or ended["kind"] in ("preempted", *NOT_PREEMPTIONS)):
                at = (ended.get("signal_at") or ended["at"]) if ended else event["at"]
                pending = {"at": at, "kind": ended["kind"] if ended else "killed", "step_reached": step_reached}
            ended = None
        elif kind in ("progress", "checkpoint"):
            step_reached = max(step_reached, event["step"])
        elif kind == "resumed" and pending is not None:
            pending["resumed_step"] = event["step"]
        elif kind == "first_step" and pending is not None:
            summary.interruptions.append(
                Interruption(
                    at=pending["at"],
                    kind=pending["kind"],
                    step_reached=pending["step_reached"],
                    resumed_step=pending.get("resumed_step", 0),
                    recovery_seconds=round(event["at"] - pending["at"], 3),
                )
            )
            pending = None
        elif kind == "preempted":
            step_reached = max(step_reached, event["step"])
            ended = event
        elif kind == NODE_FAILURE and ended is None:  # the first sign of the loss dates it
            ended = event
        elif kind == TIME_LIMIT and (ended is None or ended["kind"] == "preempted"):
            ended = {**(ended or event), "kind": TIME_LIMIT}  # the worker's stop was the time limit's SIGTERM
        elif kind == "finished":
            summary.finished = True
            ended = event
    if pending is not None:
        summary.interruptions.append(Interruption(pending["at"], pending["kind"], pending["step_reached"], None, None))
    summary.ended = ended["kind"] if ended is not None and ended["kind"] != "finished" else None
    return summary


class Recovery(StrEnum):
    FOLLOW = "follow"  # the engine requeued the job (Slurm --requeue, Kueue): keep following it
    RESUME = "resume"  # the job is gone: submit a resume run that restores the newest checkpoint
    RESUME_ON_DEMAND = "resume_on_demand"  # as RESUME, on on-demand capacity
    GIVE_UP = "give_up"  # the spec's limit is reached: report, do not retry
    NONE = "none"  # nothing to recover


@dataclass(frozen=True)
class Decision:
    action: Recovery
    reason: str


@dataclass(frozen=True)
class Progress:
    """Where a run stands, from its live telemetry: the step reached and the rate of its current attempt."""

    step: int
    steps_per_second: float | None
    elapsed_s: float
    """seconds since the run's first attempt started"""


def progress_of(run_dir: Path, events: list[dict[str, Any]], now: float) -> Progress | None:
    """The run's progress from its telemetry file and event log; None before its worker reported."""
    payload = read_telemetry(run_dir)
    if not payload:
        return None
    started = [e["at"] for e in events if e["kind"] == "started"]
    return Progress(
        step=int(payload.get("step") or 0),
        steps_per_second=payload.get("steps_per_second"),
        elapsed_s=now - started[0] if started else 0.0,
    )


def deadline_risk(spec: TrainSpec, progress: Progress | None, summary: PreemptionSummary, now: datetime) -> str | None:
    """Why the run will miss `cost.deadline` at this pace, or None.

    The time it needs is the remaining steps at the measured rate plus what interruptions are expected
    to cost: as many more as it has had per hour so far, each losing its mean recovery time and the
    steps it threw away. Every kind counts here (a time limit or a lost node delays it as a preemption does).
    """
    deadline = spec.cost.deadline
    if deadline is None or progress is None or not progress.steps_per_second:
        return None
    rate = progress.steps_per_second
    remaining_s = max(spec.training.max_steps - progress.step, 0) / rate
    expected_loss_s = 0.0
    interruptions = len(summary.interruptions)
    if interruptions and progress.elapsed_s > 0:
        recoveries = summary.recovery_seconds
        loss_each = (sum(recoveries) / len(recoveries) if recoveries else 0.0) + (
            summary.lost_steps / interruptions / rate
        )
        expected_loss_s = interruptions / progress.elapsed_s * remaining_s * loss_each
    left_s = (deadline - now).total_seconds()
    if remaining_s + expected_loss_s <= left_s:
        return None
    return (
        f"deadline at risk: {remaining_s / 60:.0f} min of training left at {rate:.1f} steps/s plus "
        f"{expected_loss_s / 60:.0f} min expected preemption losses, {max(left_s, 0) / 60:.0f} min before "
        f"cost.deadline {deadline:%Y-%m-%d %H:%M %Z}"
    )


def fallback_reason(spec: TrainSpec, preemptions: int, risk: str | None = None) -> str | None:
    """Why a spot run should move to on-demand capacity now, or None."""
    if not spec.resources.spot:
        return None
    if preemptions >= spec.preemption.fallback_to_ondemand_after:
        return f"{preemptions} preemptions on spot >= preemption.fallback_to_ondemand_after"
    return risk


def decide(
    spec: TrainSpec,
    status: JobStatus,
    summary: PreemptionSummary,
    engine_keeps_job: bool = False,
    risk: str | None = None,
) -> Decision:
    """The failover sequence for a preempted run.

    1. The engine requeued the job, or keeps it through a preemption (a Kueue-evicted Job is suspended
       and requeued by Kueue; a Job whose spot node was reclaimed gets new pods): follow it.
    2. The job is gone and fewer than `max_preemptions` happened: resume from the newest checkpoint,
       on spot while fewer than `fallback_to_ondemand_after` preemptions happened and the deadline is
       not at risk (`risk`, from `deadline_risk`), else on-demand.
    3. Otherwise give up and say why.
    An engine-kept job moves to on-demand where it waits (LauncherResource, `fallback_reason`).
    Failures that are not preemptions are never retried here (see the run-status sensor).
    """
    policy = spec.preemption
    count = summary.preemptions_with(status)
    if status.state in (JobState.REQUEUED, JobState.PENDING, JobState.RUNNING) or (
        status.state == JobState.PREEMPTED and engine_keeps_job
    ):
        return Decision(Recovery.FOLLOW, f"{status.state.value.lower()}: the engine keeps the job")
    if status.state != JobState.PREEMPTED:
        return Decision(Recovery.NONE, f"job is {status.state.value}")
    if count >= policy.max_preemptions:
        return Decision(Recovery.GIVE_UP, f"{count} preemptions reached preemption.max_preemptions")
    if (why := fallback_reason(spec, count, risk)) is not None:
        return Decision(Recovery.RESUME_ON_DEMAND, f"{why}; resuming on on-demand")
    return Decision(Recovery.RESUME, f"preemption {count}: resuming from the newest checkpoint")
