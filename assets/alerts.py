"""Alert rules as asset checks on each `training_run` partition (warnings: they never block lineage).

Each check reads the run's telemetry (written by the worker) and evaluates one rule with the
thresholds of the `alerts` resource. A failing check says what is wrong, on which run, and what
to look at; it is logged here and delivered to Slack by the alert sensor.
"""

import time
import warnings

import dagster as dg

from assets.partitions import training_runs
from resources.alerts import AlertsResource
from resources.platform import PlatformResource
from training_platform.telemetry.alerts import evaluate_run
from training_platform.telemetry.records import RunRecord, load_run_record, load_run_records

RULE_DESCRIPTIONS = {
    "low_utilization": "Device utilization stays above the floor (default 50%) over every window (default 10 min).",
    "data_wait": "The training loop waits for data at most the allowed share of its time (default 10%).",
    "checkpoint_overhead": "Checkpointing takes at most the allowed share of the training loop (default 2%).",
    "cost_outlier": "The run costs at most 3x the median of its sweep or family.",
    "queue_wait": "The run started within the allowed queue wait (default 2 h).",
}


def _measured(record: RunRecord, rule: str) -> dict[str, float | str]:
    values = {
        "low_utilization": {"mean_utilization_pct": record.mean_utilization},
        "data_wait": {"data_wait_fraction": record.data_wait_fraction},
        "checkpoint_overhead": {"checkpoint_overhead": record.checkpoint_overhead},
        "cost_outlier": {"cost_usd": record.cost_usd},
        "queue_wait": {
            "queue_wait_s": (record.started_at - record.queued_at)
            if record.started_at is not None and record.queued_at is not None
            else None
        },
    }[rule]
    return {k: round(v, 6) for k, v in values.items() if v is not None}


def run_record_for_check(context: dg.AssetCheckExecutionContext, platform: PlatformResource) -> RunRecord:
    record = load_run_record(platform.paths(), context.partition_key)
    dagster_run = context.instance.get_run_record_by_id(context.run.run_id)
    return record.merged(queued_at=dagster_run.create_timestamp.timestamp() if dagster_run else None)


def alert_check(rule: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="training_run",
        name=rule,
        partitions_def=training_runs,
        description=RULE_DESCRIPTIONS[rule],
        blocking=False,
    )
    def _check(
        context: dg.AssetCheckExecutionContext, platform: PlatformResource, alerts: AlertsResource
    ) -> dg.AssetCheckResult:
        record = run_record_for_check(context, platform)
        peers = load_run_records(platform.paths()) if rule == "cost_outlier" else []
        alert = evaluate_run(record, peers, alerts.thresholds(), time.time())[rule]
        metadata: dict = {"run_id": record.run_id, **_measured(record, rule)}
        if alert is None:
            return dg.AssetCheckResult(passed=True, description=f"quiet on run {record.run_id}", metadata=metadata)
        context.log.warning(alert.text())
        metadata.update({"threshold": alert.threshold, "look_at": alert.look_at})
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=alert.text(),
            metadata=metadata,
        )

    return _check


# Partitioned asset checks are a Dagster preview: without them a check would load every run at once.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.PreviewWarning)
    ALERT_CHECKS = [alert_check(rule) for rule in RULE_DESCRIPTIONS]
