"""New data: a new or changed drop in the landing directory requests that day's dataset_snapshot partition.

A drop the day's newest snapshot already holds, byte for byte, is not built again: `tp retrain` backfills the
days it trains, and the sensor's first look (or its first after a cursor was reset) would otherwise rebuild
each of them.
"""

from __future__ import annotations

import json

import dagster as dg

from assets.datasets import DAILY_SOURCE, daily_snapshots, landing_for
from assets.jobs import snapshot_job
from resources.platform import PlatformResource
from training_platform.datasets.daily import Drop, list_drops
from training_platform.spec.submission import SNAPSHOT_ASSET, snapshot_run_config


@dg.sensor(
    name="new_data_sensor",
    job=snapshot_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests the day's dataset_snapshot partition when a drop lands in (or changes in) $TP_HOME/landing.",
)
def new_data_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource):
    landing = landing_for(platform)
    drops = list_drops(landing)
    # Cursor: the hash of every drop seen, by file name; a changed drop is new data for its day.
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    requests = []
    for drop in drops:
        if seen.get(drop.path.name) == drop.sha256:
            continue
        day = drop.day.isoformat()
        if not daily_snapshots.has_partition_key(day):
            context.log.warning(f"drop {drop.path.name} is outside the snapshot partitions; it is ignored")
            continue
        if _built_with(context.instance, day, drop):
            continue
        requests.append(
            dg.RunRequest(
                # By content: the same drop is never snapshotted twice, a corrected one is.
                run_key=f"{day}:{drop.sha256}",
                partition_key=day,
                run_config=snapshot_run_config(DAILY_SOURCE),
                tags={"tp/drop": drop.path.name, "tp/drop_sha256": drop.sha256},
            )
        )
    cursor = json.dumps({drop.path.name: drop.sha256 for drop in drops}, sort_keys=True)
    if not requests:
        return dg.SensorResult(skip_reason=f"no new or changed drops in {landing}", cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


def _built_with(instance: dg.DagsterInstance, day: str, drop: Drop) -> bool:
    """The day's newest snapshot was built from this very drop (its metadata lists the drops it holds)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(SNAPSHOT_ASSET), asset_partitions=[day]), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    held = materialization.metadata.get("drops") if materialization is not None else None
    return held is not None and isinstance(held.value, list) and drop.as_dict() in held.value
