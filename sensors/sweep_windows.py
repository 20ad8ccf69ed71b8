"""Hourly release of queued sweeps inside their cost window (the cheapest start before the deadline)."""

import os
from datetime import UTC, datetime

import dagster as dg

from training_platform.paths import PlatformHome
from training_platform.sweeps import SweepQueue
from training_platform.sweeps.queue import queue_tags

# Hourly: price curves change by the hour. TP_SWEEP_RELEASE_CRON overrides it (read when the code loads).
RELEASE_CRON = os.environ.get("TP_SWEEP_RELEASE_CRON") or "0 * * * *"


@dg.schedule(
    cron_schedule=RELEASE_CRON,
    job_name="sweep_job",
    execution_timezone="UTC",
    # On by default: a queued sweep must start in its window without anyone switching this on.
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every hour: start the queued sweeps whose cost window has opened; the others keep waiting.",
)
def sweep_window_schedule(context: dg.ScheduleEvaluationContext):
    at = context.scheduled_execution_time or datetime.now(UTC)
    queue = SweepQueue(PlatformHome.from_env().root)
    requests = []
    for queued in queue.due(at):
        base = queued.sweep.base_spec
        window = queued.window
        requests.append(
            dg.RunRequest(
                # One release per sweep and window: a second tick inside the window does not start it twice.
                run_key=f"{queued.sweep.name}@{window['start']}",
                partition_key=queued.sweep.name,
                tags=queue_tags(
                    base.team,
                    base.resources.priority,
                    sweep=queued.sweep.name,
                    window_start=window["start"],
                    window_expected_cost_usd=str(window["expected_cost"]),
                    window_saving_usd=str(window["saving"]),
                ),
            )
        )
    if not requests:
        waiting = [f"{q.sweep.name} at {q.start:%Y-%m-%d %H:%M}" for q in queue.all() if q.state == "QUEUED"]
        return dg.SkipReason("no sweep window open" + (f"; waiting: {', '.join(waiting)}" if waiting else ""))
    return requests
