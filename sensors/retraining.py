"""Training after a snapshot: `tp train` on fresh data, nightly retraining, backfills of days.

Two pieces, so that a training run always starts after its snapshot exists and passed its expectations:

- `nightly_retraining` (schedule, default 02:00 UTC): registers the run `<spec name>-<day>` (its spec reads
  the snapshot as of the day), adds the training_runs partition and requests the day's dataset_snapshot
  tagged to train that run.
- `retraining_sensor`: when a dataset_snapshot partition is materialized by a run tagged `tp/then_train`
  (`tp train`, the schedule) or by a backfill (`tp retrain`, the UI), requests that run, or the backfilled
  day's run of the spec in the snapshot's config (else of the retrained spec); a day is trained once.
  Snapshots built by the new-data sensor do not train: they wait for the night.

The model is promoted only through the gate in `registered_model`, like every other run. A run takes the
snapshot run's `tp/serial` tag, so the days of one `tp retrain` train one after the other, in order.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field

from assets.datasets import ASSET_KEY, daily_snapshots, landing_for
from assets.jobs import run_asset_keys, snapshot_job, training_pipeline
from assets.partitions import training_runs
from resources.platform import PlatformResource
from sensors.schedule_switch import default_schedule_status
from training_platform.datasets.daily import is_dated_source, list_drops
from training_platform.errors import PlatformError
from training_platform.runs.retraining import register_day_run
from training_platform.runs.specs import load_run_spec, register_submitted, spec_from_json, spec_tags
from training_platform.shipped import DAILY_SPEC
from training_platform.spec import TrainSpec, load_spec
from training_platform.spec.submission import BACKFILL_TAG, SERIAL_TAG, THEN_TRAIN_TAG, snapshot_run_config


class RetrainingConfig(BaseModel):
    """When and what to retrain; environment variables override the defaults (read when the code loads)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cron: str = Field("0 2 * * *", description="cron of the nightly tick (TP_RETRAIN_CRON); default 02:00")
    timezone: str = Field("UTC", description="timezone of the cron and of 'the day' (TP_RETRAIN_TIMEZONE)")
    spec_path: Path = Field(DAILY_SPEC, description="spec retrained every day (TP_RETRAIN_SPEC)")
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
        default_status=default_schedule_status(),
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
            run_config=snapshot_run_config(spec.dataset.source, dataset=spec.dataset),
            tags={THEN_TRAIN_TAG: run_id, **spec_tags(spec)},
        )

    return nightly_retraining


nightly_retraining = build_retraining_schedule(RETRAINING)


@dg.sensor(
    name="retraining_sensor",
    job=training_pipeline,
    minimum_interval_seconds=5,  # `tp train` waits on it; a tick is one indexed query when nothing is new
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Starts a training run once its dataset_snapshot passes its expectations: the run a snapshot "
    "was tagged to train (tp train, the nightly schedule), or each backfilled day's run (tp retrain, the UI); "
    "a day is trained once.",
)
def retraining_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource):
    instance = context.instance
    after = int(context.cursor) if context.cursor else 0
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=ASSET_KEY, after_storage_id=after), limit=100, ascending=True
    ).records
    if not records:
        return dg.SensorResult(skip_reason="no new dataset_snapshot materializations", cursor=context.cursor)
    home = platform.paths()
    known = set(instance.get_dynamic_partitions(training_runs.name))
    trained = instance.get_materialized_partitions(dg.AssetKey("training_run"))
    requests: list[dg.RunRequest] = []
    added: list[str] = []
    cursor = context.cursor
    for record in records:
        materialization = record.asset_materialization
        run = instance.get_run_by_id(record.run_id)
        if run is not None and not run.is_finished:
            break  # its expectations still run, or it is being cancelled: decided at a later tick
        cursor = str(record.storage_id)
        if not materialization or not materialization.partition or run is None:
            continue
        if run.status != dg.DagsterRunStatus.SUCCESS:
            continue  # a failed suite, or a cancelled run, trains nothing
        try:
            planned = _planned_run(home, run, materialization)
        except PlatformError as exc:
            context.log.warning(f"snapshot run {run.run_id}: not training: {exc}")
            continue
        if planned is None:
            continue
        run_id, spec = planned
        if run_id in trained or any(request.partition_key == run_id for request in requests):
            continue
        if run_id not in known:
            known.add(run_id)
            added.append(run_id)
        serial = {SERIAL_TAG: run.tags[SERIAL_TAG]} if SERIAL_TAG in run.tags else {}
        requests.append(
            dg.RunRequest(
                run_key=run_id,  # one training run per planned run, however often its snapshot is rebuilt
                partition_key=run_id,
                tags={**spec_tags(spec), "tp/snapshot_day": materialization.partition, **serial},
                asset_selection=run_asset_keys(spec),
            )
        )
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[training_runs.build_add_request(added)] if added else [],
        cursor=cursor,
    )


def _planned_run(home, run: dg.DagsterRun, materialization: dg.AssetMaterialization) -> tuple[str, TrainSpec] | None:
    """The run (id, spec) a snapshot materialization starts, registered; None when it starts none.

    Only a snapshot that passed its expectations, of the source the spec trains on, starts a run.
    """
    config = ((run.run_config or {}).get("ops", {}).get("dataset_snapshot") or {}).get("config", {})
    if THEN_TRAIN_TAG in run.tags:
        run_id = run.tags[THEN_TRAIN_TAG]
        spec = register_submitted(home, run_id, config["spec"]) if config.get("spec") else load_run_spec(home, run_id)
    elif BACKFILL_TAG in run.tags:
        base = spec_from_json(config["spec"], "backfill config: spec") if config.get("spec") else RETRAINING.spec()
        day = date.fromisoformat(materialization.partition)
        run_id = register_day_run(home, base, day)
        spec = load_run_spec(home, run_id)
    else:
        return None
    metadata = materialization.metadata
    source, passed = metadata.get("source"), metadata.get("expectations_passed")
    if (source is not None and source.value != spec.dataset.source) or (passed is not None and not passed.value):
        return None
    return run_id, spec
