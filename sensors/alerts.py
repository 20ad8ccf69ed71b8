"""The alert sensor: fleet rules (queue wait, failure rate) and per-run rules, delivered once each.

Run records come from the Dagster instance (queue, start and end times, final state) merged with
each run's own telemetry file (utilization, data wait, checkpoint overhead, cost). The cursor
remembers what was delivered, so an alert reaches the log and Slack once, not every tick.
"""

import json
import time

import dagster as dg

from resources.alerts import AlertsResource
from resources.platform import PlatformResource
from training_platform.paths import PlatformHome
from training_platform.runs import SUBMITTED_SPEC
from training_platform.telemetry.alerts import Alert, evaluate_fleet, evaluate_run
from training_platform.telemetry.records import RunRecord, latest_per_run, load_run_record

TRAINING_ASSET = dg.AssetKey("training_run")
PARTITION_TAG = "dagster/partition"
_STATES = {
    dg.DagsterRunStatus.QUEUED: "QUEUED",
    dg.DagsterRunStatus.NOT_STARTED: "QUEUED",
    dg.DagsterRunStatus.STARTING: "QUEUED",
    dg.DagsterRunStatus.STARTED: "RUNNING",
    dg.DagsterRunStatus.SUCCESS: "SUCCEEDED",
    dg.DagsterRunStatus.FAILURE: "FAILED",
    dg.DagsterRunStatus.CANCELING: "CANCELED",
    dg.DagsterRunStatus.CANCELED: "CANCELED",
}
MAX_REMEMBERED = 2000


def is_training_run(run: dg.DagsterRun, home: PlatformHome) -> bool:
    """A run that materialized a training_runs partition (launched from a job, the UI or `tp`)."""
    partition = run.tags.get(PARTITION_TAG)
    if partition is None:
        return False
    if run.asset_selection:
        return TRAINING_ASSET in run.asset_selection
    # dg.materialize (as `tp` uses it) records no asset selection: the run registry decides.
    return (home.run_dir(partition) / SUBMITTED_SPEC).is_file()


def dagster_run_records(instance: dg.DagsterInstance, home: PlatformHome, limit: int = 500) -> list[RunRecord]:
    """One record per Dagster run that trained a partition, newest first, with the run's telemetry merged in."""
    records = []
    for entry in instance.get_run_records(limit=limit):
        run = entry.dagster_run
        if not is_training_run(run, home):
            continue
        run_id = run.tags[PARTITION_TAG]
        on_disk = load_run_record(home, run_id)
        worker_started = on_disk.started_at
        created = entry.create_timestamp.timestamp()
        # The worker's telemetry belongs to this Dagster run only if it started after the run was created.
        if worker_started is not None and worker_started < created:
            on_disk = RunRecord(run_id=run_id, family=on_disk.family, team=on_disk.team, max_steps=on_disk.max_steps)
        status = _STATES.get(run.status, "UNKNOWN")
        records.append(
            on_disk.merged(
                status=status,
                queued_at=created,
                ended_at=entry.end_time if status in ("SUCCEEDED", "FAILED", "CANCELED") else None,
                team=on_disk.team or run.tags.get("team") or None,
                extra={"dagster_run_id": run.run_id},
            )
        )
    return records


def alerts_now(records: list[RunRecord], alerts: AlertsResource, now: float) -> list[Alert]:
    thresholds = alerts.thresholds()
    found = evaluate_fleet(records, thresholds, now)
    latest = latest_per_run(records)
    for record in latest:
        if record.status == "SUCCEEDED":
            found += [a for a in evaluate_run(record, latest, thresholds, now).values() if a is not None]
    return found


@dg.sensor(
    name="alert_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Delivers platform alerts (idle devices, data stalls, stuck queues, failures, cost spikes) "
    "to the log and, when configured, Slack.",
)
def alert_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource, alerts: AlertsResource):
    records = dagster_run_records(context.instance, platform.paths())
    found = alerts_now(records, alerts, time.time())
    delivered = json.loads(context.cursor) if context.cursor else []
    fresh = [a for a in found if f"{a.rule}:{a.run_id}" not in set(delivered)]
    problems = alerts.deliver(fresh, context.log)
    delivered = (delivered + [f"{a.rule}:{a.run_id}" for a in fresh])[-MAX_REMEMBERED:]
    context.update_cursor(json.dumps(delivered))
    summary = f"{len(fresh)} new alert(s) of {len(found)} firing over {len(records)} training run(s)"
    return dg.SkipReason(summary + (f"; {len(problems)} delivery problem(s)" if problems else ""))
