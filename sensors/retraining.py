"""Scheduled retraining: each night, the day's snapshot, then the day's training run, promoted only by the gate.

Two pieces, so that a training run always starts after its snapshot exists:

- `nightly_retraining` (schedule, default 02:00 UTC): registers the run `<spec name>-<day>` (its spec reads
  the snapshot as of the day), adds the training_runs partition and requests the day's dataset_snapshot.
- `retraining_sensor`: when a dataset_snapshot partition is materialized by that schedule or by a backfill
  (from the UI), requests the day's `training_pipeline` run, unless that day is trained already. Snapshots
  built by the new-data sensor or `tp demo` do not train: they wait for the night.

The model is promoted only through the gate in `registered_model`, like every other run.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field

from assets.datasets import ASSET_KEY, daily_snapshots, landing_for, snapshot_run_config
from assets.jobs import snapshot_job, training_pipeline
from assets.partitions import training_runs
from resources.platform import PlatformResource
from training_platform.datasets.daily import is_dated_source, list_drops
from training_platform.retraining import register_day_run
from training_platform.spec import TrainSpec, load_spec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RETRAIN_TAG = "tp/retrain_run"
"""Set on the schedule's snapshot runs: the training run to start once the snapshot exists."""
BACKFILL_TAG = "dagster/backfill"


class RetrainingConfig(BaseModel):
    """When and what to retrain; environment variables override the defaults (read when the code loads)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cron: str = Field("0 2 * * *", description="cron of the nightly tick (TP_RETRAIN_CRON); default 02:00")
    timezone: str = Field("UTC", description="timezone of the cron and of 'the day' (TP_RETRAIN_TIMEZONE)")
    spec_path: Path = Field(
        PROJECT_ROOT / "examples" / "digits-daily.yaml", description="spec retrained every day (TP_RETRAIN_SPEC)"
    )
    days_back: int = Field(
        1, ge=0, description="train on the data as of this many days before the tick (1: the day just finished)"
    )

    @classmethod
    def from_env(cls) -> RetrainingConfig:
        names = {"cron": "TP_RETRAIN_CRON", "timezone": "TP_RETRAIN_TIMEZONE", "spec_path": "TP_RETRAIN_SPEC"}
        return cls(**{field: os.environ[var] for field, var in names.items() if os.environ.get(var)})

    def day_of_tick(self, at: datetime) -> date:
        return at.astimezone(ZoneInfo(self.timezone)).date() - timedelta(days=self.days_back)

    def spec(self) -> TrainSpec:
        return load_spec(self.spec_path)


RETRAINING = RetrainingConfig.from_env()


def build_retraining_schedule(settings: RetrainingConfig) -> dg.ScheduleDefinition:
    """The nightly schedule for `settings` (tests build their own)."""

    @dg.schedule(
        name="nightly_retraining",
        cron_schedule=settings.cron,
        execution_timezone=settings.timezone,
        job=snapshot_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Retrain {settings.spec_path.name} on the data as of the day just finished, off-peak "
        f"({settings.cron} {settings.timezone}); promotion only through the gate.",
    )
    def nightly_retraining(context: dg.ScheduleEvaluationContext, platform: PlatformResource):
        at = context.scheduled_execution_time or datetime.now(ZoneInfo(settings.timezone))
        day = settings.day_of_tick(at)
        if not daily_snapshots.has_partition_key(day.isoformat()):
            return dg.SkipReason(f"{day} is before the first snapshot partition")
        spec = settings.spec()
        if is_dated_source(spec.dataset.source) and not list_drops(landing_for(platform)):
            return dg.SkipReason(f"no drops in {landing_for(platform)}: nothing to retrain on")
        run_id = register_day_run(platform.paths(), spec, day)
        # Added now, so the UI shows the day's run as soon as it is planned; the sensor starts it.
        context.instance.add_dynamic_partitions(training_runs.name, [run_id])
        return dg.RunRequest(
            run_key=run_id,
            partition_key=day.isoformat(),
            run_config=snapshot_run_config(spec.dataset.source),
            tags={RETRAIN_TAG: run_id, "team": spec.team},
        )

    return nightly_retraining


nightly_retraining = build_retraining_schedule(RETRAINING)


@dg.sensor(
    name="retraining_sensor",
    job=training_pipeline,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Starts the day's training run once its dataset_snapshot is built by the nightly schedule or a "
    "backfill (so backfilling days of snapshots rebuilds their models); a day is trained once.",
)
def retraining_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource):
    instance = context.instance
    after = int(context.cursor) if context.cursor else 0
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=ASSET_KEY, after_storage_id=after), limit=100, ascending=True
    ).records
    if not records:
        return dg.SensorResult(skip_reason="no new dataset_snapshot materializations", cursor=context.cursor)
    spec = RETRAINING.spec()
    home = platform.paths()
    known = set(instance.get_dynamic_partitions(training_runs.name))
    trained = instance.get_materialized_partitions(dg.AssetKey("training_run"))
    requests: list[dg.RunRequest] = []
    added: list[str] = []
    for record in records:
        materialization = record.asset_materialization
        metadata = materialization.metadata if materialization else {}
        run = instance.get_run_by_id(record.run_id)
        tags = run.tags if run else {}
        if not materialization or not materialization.partition or not _trains(tags, metadata, spec):
            continue
        run_id = tags.get(RETRAIN_TAG) or register_day_run(home, spec, date.fromisoformat(materialization.partition))
        if run_id in trained or any(request.partition_key == run_id for request in requests):
            continue
        if run_id not in known:
            known.add(run_id)
            added.append(run_id)
        requests.append(
            dg.RunRequest(
                run_key=run_id,  # one training run per day from this sensor, however often the day is rebuilt
                partition_key=run_id,
                tags={"team": spec.team, "tp/snapshot_day": materialization.partition},
            )
        )
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[training_runs.build_add_request(added)] if added else [],
        cursor=str(records[-1].storage_id),
    )


def _trains(tags: dict, metadata: dict, spec: TrainSpec) -> bool:
    """Only the schedule's and backfills' snapshots of the retrained source, and only if they passed the suite."""
    if RETRAIN_TAG not in tags and BACKFILL_TAG not in tags:
        return False
    source = metadata.get("source")
    passed = metadata.get("expectations_passed")
    return (source is None or source.value == spec.dataset.source) and (passed is None or bool(passed.value))
