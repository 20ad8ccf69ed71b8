"""What the platform does for a job the engine keeps through a preemption (a requeued Slurm job, a Job
Kueue evicted) while it waits to run again.

1. Spot fallback: after `preemption.fallback_to_ondemand_after` preemptions, or when `cost.deadline`
   is at risk at the run's measured pace, the launcher moves the job to on-demand capacity.
2. No idle hold: a job whose last attempt wrote its emergency checkpoint starts at once, not after
   Slurm's two-minute requeue delay.
In that order: a job released first could start on spot before it is moved.

A job that is gone after a preemption (the local launcher) is resubmitted by the preemption sensor
instead (`preemption.decide`). Whoever follows a kept job (the `training_run` asset while it waits,
the preemption sensor after) calls `follow_requeued` on each poll.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from training_platform.launch.base import JobHandle, JobState, JobStatus, Launcher
from training_platform.recovery.preemption import deadline_risk, fallback_reason, progress_of, summarize
from training_platform.runs.events import MOVED_TO_ON_DEMAND, RunEvents
from training_platform.spec import TrainSpec

WAITING = (JobState.REQUEUED, JobState.PREEMPTED)  # requeued by Slurm, evicted (suspended) by Kueue


def follow_requeued(
    launcher: Launcher, handle: JobHandle, spec: TrainSpec, run_dir: Path, status: JobStatus
) -> list[str]:
    """Move the waiting job to on-demand when due, then release it from any hold; what was done."""
    if status.state not in WAITING or not status.preemptions:
        return []
    done = [moved] if (moved := fall_back_if_due(launcher, handle, spec, run_dir, status)) else []
    if (released := launcher.release_requeue_hold(handle)) is not None:
        done.append(released)
    return done


def fall_back_if_due(
    launcher: Launcher, handle: JobHandle, spec: TrainSpec, run_dir: Path, status: JobStatus
) -> str | None:
    """Move the waiting spot job to on-demand when due; what was done (recorded as an event), else None."""
    if not spec.resources.spot:
        return None
    events = RunEvents(run_dir)
    history = events.read()
    if any(e["kind"] == MOVED_TO_ON_DEMAND and e.get("job_id") == handle.job_id for e in history):
        return None
    summary = summarize(history)
    risk = deadline_risk(spec, progress_of(run_dir, history, time.time()), summary, datetime.now(UTC))
    reason = fallback_reason(spec, summary.preemptions_with(status), risk)
    if reason is None:
        return None
    done = launcher.move_to_on_demand(handle, spec)
    if done is None:
        return None
    events.append(MOVED_TO_ON_DEMAND, job_id=handle.job_id, reason=reason)
    return f"{reason}: {done}"
