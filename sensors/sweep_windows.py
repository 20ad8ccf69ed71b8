"""Hourly release of queued sweeps and runs inside their cost window (the cheapest start before the deadline)."""

import os
from datetime import UTC, datetime

import dagster as dg

from assets.jobs import run_asset_keys
from sensors.schedule_switch import default_schedule_status
from training_platform.cost.run_windows import RunWindowQueue
from training_platform.paths import PlatformHome
from training_platform.runs.specs import queue_tags
from training_platform.spec.submission import PARTITION_TAG, TRAINING_JOB, training_run_config
from training_platform.sweeps import SweepQueue

# Hourly: price curves change by the hour. TP_SWEEP_RELEASE_CRON overrides it (read when the code loads).
RELEASE_CRON = os.environ.get("TP_SWEEP_RELEASE_CRON") or "0 * * * *"
WINDOW_TAG = "tp/window_start"


@dg.schedule(
    cron_schedule=RELEASE_CRON,
    job_name="sweep_job",
    execution_timezone="UTC",
    # On by default: a queued sweep must start in its window without anyone switching this on.
    default_status=default_schedule_status(),
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


@dg.schedule(
    cron_schedule=RELEASE_CRON,
    job_name=TRAINING_JOB,
    execution_timezone="UTC",
    default_status=default_schedule_status(),
    description="Every hour: submit the runs with a cost.deadline whose cost window has opened (`tp train`).",
)
def run_window_schedule(context: dg.ScheduleEvaluationContext):
    at = context.scheduled_execution_time or datetime.now(UTC)
    queue = RunWindowQueue(PlatformHome.from_env().root)
    requests = []
    for waiting in queue.due(at):
        released = {PARTITION_TAG: waiting.run_id, WINDOW_TAG: waiting.window["start"]}
        # A schedule's run key is unique per tick only: the instance says whether an earlier tick released it.
        if context.instance.get_run_records(filters=dg.RunsFilter(tags=released), limit=1):
            continue
        requests.append(
            dg.RunRequest(
                run_key=f"{waiting.run_id}@{waiting.window['start']}",
                partition_key=waiting.run_id,
                run_config=training_run_config(waiting.spec),
                tags={**waiting.tags, WINDOW_TAG: waiting.window["start"]},
                asset_selection=run_asset_keys(waiting.spec),
            )
        )
    if not requests:
        waiting = [f"{w.run_id} at {w.start:%Y-%m-%d %H:%M}" for w in queue.all() if w.start > at]
        return dg.SkipReason("no run window open" + (f"; waiting: {', '.join(waiting)}" if waiting else ""))
    return requests
