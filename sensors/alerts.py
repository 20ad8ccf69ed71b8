"""The alert sensor: live rules while they happen, and the per-run rules of finished runs, delivered once each.

Run records come from the Dagster instance (queue, start and end times, final state) merged with
each run's own telemetry file (utilization, data wait, checkpoint overhead, cost), which running
workers refresh; team spend comes from the cost ledger. Every minute it evaluates a running run's
utilization, a queued run's wait, each team's failure rate over a day and its last hour's spend
(training_platform/telemetry/alerts.py). An alert goes to the log, the webhook, the run's tags and,
for a run's own rules, the run's asset check in the UI. The cursor remembers what was delivered (by
`Alert.key`), so an alert is delivered once, not every tick; its run tag is kept while it fires.
"""

import json
import time
from datetime import UTC, datetime

import dagster as dg

from resources.alerts import AlertsResource
from resources.platform import PlatformResource
from training_platform.cost.backends import open_ledger
from training_platform.paths import PlatformHome
from training_platform.runs.specs import is_registered
from training_platform.spec.submission import PARTITION_TAG
from training_platform.telemetry.alerts import RUN_RULES, Alert, evaluate_live, evaluate_run
from training_platform.telemetry.records import RunRecord, latest_per_run, orchestrated_record

TRAINING_ASSET = dg.AssetKey("training_run")
MAX_REMEMBERED = 2000
ALERT_TAG_PREFIX = "tp/alert/"
TAG_VALUE_CHARS = 250  # what the run page shows of a tag; the full text is in the log and the check


def is_training_run(run: dg.DagsterRun, home: PlatformHome) -> bool:
    """A run that materialized a training_runs partition (launched from a job, the UI or `tp`)."""
    partition = run.tags.get(PARTITION_TAG)
    if partition is None:
        return False
    if run.asset_selection:
        return TRAINING_ASSET in run.asset_selection
    # dg.materialize (as `tp` uses it) records no asset selection: the run registry decides.
    return is_registered(home, partition)


def dagster_run_records(instance: dg.DagsterInstance, home: PlatformHome, limit: int = 500) -> list[RunRecord]:
    """One record per Dagster run that trained a partition, newest first, with the run's telemetry merged in."""
    records = []
    for entry in instance.get_run_records(limit=limit):
        run = entry.dagster_run
        if is_training_run(run, home):
            records.append(
                orchestrated_record(
                    home, run.tags[PARTITION_TAG], run.status.value, entry.create_timestamp.timestamp(),
                    entry.end_time, run.tags.get("team", ""), run.run_id,
                )
            )
    return records


def team_spend(home: PlatformHome, now: float, hours: int) -> list[tuple[str, float, float]]:
    """(team, epoch seconds, dollars) of the ledger's records of the trailing window."""
    since = datetime.fromtimestamp(now - (hours + 1) * 3600, tz=UTC)
    return [
        (r["team"], datetime.fromisoformat(r["at"]).timestamp(), float(r["total_usd"]))
        for r in open_ledger(home.root).records(since=since)
    ]


def alerts_now(records: list[RunRecord], alerts: AlertsResource, now: float, spend=()) -> list[Alert]:
    thresholds = alerts.thresholds()
    latest = latest_per_run(records)
    found = evaluate_live(latest, thresholds, now, spend)
    for record in latest:
        if record.status == "SUCCEEDED":
            found += [a for a in evaluate_run(record, latest, thresholds, now).values() if a is not None]
    return found


def keep_tags(instance: dg.DagsterInstance, alerts: list[Alert], records: list[RunRecord]) -> None:
    """Each firing alert of a run as a tag on its Dagster run, put back where it went missing.

    Every tick, not once: Dagster's `add_run_tags` reads the run, merges and writes it back, so a
    running run publishing its progress tags at the same moment can write over the alert's tag.
    """
    dagster_run_ids = {r.run_id: r.extra.get("dagster_run_id") for r in latest_per_run(records)}
    wanted = [
        (dagster_run_ids[a.run_id], f"{ALERT_TAG_PREFIX}{a.rule}", a.text()[:TAG_VALUE_CHARS])
        for a in alerts
        if not a.period and dagster_run_ids.get(a.run_id)  # team rules belong to no single run
    ]
    if not wanted:
        return
    runs = instance.get_runs(filters=dg.RunsFilter(run_ids=list({run_id for run_id, _, _ in wanted})))
    tags = {run.run_id: run.tags for run in runs}
    for run_id, key, value in wanted:
        if run_id in tags and tags[run_id].get(key) != value:
            instance.add_run_tags(run_id, {key: value})


def show_check(instance: dg.DagsterInstance, alert: Alert, records: list[RunRecord]) -> None:
    """A running run's alert of its own rules as a failed asset check on its partition."""
    record = next((r for r in records if r.run_id == alert.run_id), None)
    if record is None or alert.period:
        return
    if alert.rule in RUN_RULES and not record.finished:  # a finished run's checks ran with it
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=TRAINING_ASSET,
                check_name=alert.rule,
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR if alert.severity == "ERROR" else dg.AssetCheckSeverity.WARN,
                description=alert.text(),
                metadata={"value": alert.value, "threshold": alert.threshold, "live": True},
                partition=alert.run_id,
            )
        )


@dg.sensor(
    name="alert_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Delivers platform alerts while they matter (idle devices, stuck queues, a team's failures or "
    "spend spike) and the checks of finished runs, to the log, the webhook, run tags and asset checks.",
)
def alert_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource, alerts: AlertsResource):
    home = platform.paths()
    now = time.time()
    records = dagster_run_records(context.instance, home)
    found = alerts_now(records, alerts, now, team_spend(home, now, alerts.spend_trailing_hours))
    delivered = json.loads(context.cursor) if context.cursor else []
    already = set(delivered)
    fresh = list({a.key: a for a in found if a.key not in already}.values())
    problems = alerts.deliver(fresh, context.log)
    for alert in fresh:
        show_check(context.instance, alert, records)
    keep_tags(context.instance, found, records)
    delivered = (delivered + [a.key for a in fresh])[-MAX_REMEMBERED:]
    context.update_cursor(json.dumps(delivered))
    summary = f"{len(fresh)} new alert(s) of {len(found)} firing over {len(records)} training run(s)"
    return dg.SkipReason(summary + (f"; {len(problems)} delivery problem(s)" if problems else ""))
