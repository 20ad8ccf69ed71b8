"""The dataset snapshot asset, one partition per day (the data as of that day), and its blocking GX check."""

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, ValidationError

from resources.platform import PlatformResource
from training_platform.datasets import validate_snapshot
from training_platform.datasets.daily import DIGITS_DAILY, DatedSnapshot, build_snapshot_as_of, default_landing
from training_platform.datasets.files import FileSource, build_file_snapshot, read_source_table
from training_platform.errors import SpecError
from training_platform.runs.specs import spec_from_json
from training_platform.spec import DatasetSpec, format_validation_error
from training_platform.spec.file_source import FileExpectations, FileSplit, is_file_uri
from training_platform.spec.submission import SNAPSHOT_ASSET, SNAPSHOT_CHECK

SNAPSHOT_START_DATE = "2026-11-01"
"""First day a snapshot partition exists for; backfills reach back to here."""
SNAPSHOT_TIMEZONE = "UTC"
DAILY_SOURCE = DIGITS_DAILY.name
"""The source a partition is built from unless the run's config names another (the UI backfills this one)."""
EXPECTATIONS = SNAPSHOT_CHECK
ASSET_KEY = dg.AssetKey(SNAPSHOT_ASSET)

# end_offset=1: today's partition exists (data as of now, rebuilt as drops land), not only finished days.
OwnFiles = tuple[Any, FileExpectations]
"""A file source's rows (a pandas frame) and the spec's expectations on them."""

daily_snapshots = dg.DailyPartitionsDefinition(
    start_date=SNAPSHOT_START_DATE, timezone=SNAPSHOT_TIMEZONE, end_offset=1
)


class SnapshotConfig(dg.Config):
    source: str = Field(
        DAILY_SOURCE,
        description="data source: a dated one (digits_daily) holds every landing drop dated on or before the "
        "partition's day; an un-dated one (sklearn_digits) is the same snapshot every day",
    )
    landing_dir: str | None = Field(None, description="landing directory of daily drops; default $TP_HOME/landing")
    spec: str | None = Field(
        None,
        description="a TrainSpec (JSON) to train once this snapshot passes its expectations: the run named by the "
        "run's `tp/then_train` tag (`tp train`), or each backfilled day's run (`tp retrain`)",
    )
    dataset: str | None = Field(
        None,
        description="for a source of your own files: the spec's dataset section (JSON) with its columns and split, "
        'e.g. {"source": "/data/wine", "columns": {"label": "target"}}',
    )


def today_partition() -> str:
    """Today's partition key in the partitions' timezone (UTC)."""
    return datetime.now(UTC).date().isoformat()


def landing_for(platform: PlatformResource, landing_dir: str | None = None) -> Path:
    return Path(landing_dir).expanduser() if landing_dir else default_landing(platform.paths().root)


@dg.asset(
    partitions_def=daily_snapshots,
    group_name="training",
    kinds={"parquet"},
    description="Immutable, content-addressed dataset snapshot of the data as of the partition's day.",
    # The check runs inside the asset: a standalone asset check loads every partition's value at once.
    check_specs=[
        dg.AssetCheckSpec(
            EXPECTATIONS,
            asset="dataset_snapshot",
            blocking=True,
            description="Great Expectations suite: schema, value ranges, no nulls, class balance, disjoint splits.",
        )
    ],
)
def dataset_snapshot(context: dg.AssetExecutionContext, config: SnapshotConfig, platform: PlatformResource):
    if config.spec:  # the run to train after this snapshot: refused now, not after the build
        spec_from_json(config.spec, source="dataset_snapshot config: spec")
    root = platform.paths().snapshots
    day = date.fromisoformat(context.partition_key)
    built, own_files = _build(config, platform, day)
    manifest = built.manifest
    context.log.info(
        f"snapshot {manifest.snapshot_id} of {config.source} as of {day}: {manifest.rows}, {len(built.drops)} drops"
    )
    report = validate_snapshot(root, manifest.snapshot_id, own_files)
    summary = manifest.summary() | {"day": day.isoformat(), "drops": [d.as_dict() for d in built.drops]}
    metadata = {
        "snapshot_id": manifest.snapshot_id,
        "day": day.isoformat(),
        "source": manifest.source,
        "source_sha256": manifest.source_sha256,
        "rows": dg.MetadataValue.json(summary["rows"]),
        "drops_included": len(built.drops),
        "drops": dg.MetadataValue.json(summary["drops"]),
        "shards": summary["shards"],
        "bytes": summary["bytes"],
        # Read by the snapshot resolver: a snapshot that failed its suite never feeds training.
        "expectations_passed": report.success,
        "manifest": dg.MetadataValue.path(f"{root}/{manifest.snapshot_id}.json"),
        "schema": dg.MetadataValue.table_schema(
            dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in manifest.schema.items()])
        ),
    }
    yield dg.Output(summary, metadata=metadata, data_version=dg.DataVersion(manifest.snapshot_id))
    yield dg.AssetCheckResult(
        check_name=EXPECTATIONS,
        passed=report.success,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.summary(),
        metadata={
            "snapshot_id": manifest.snapshot_id,
            "day": day.isoformat(),
            "expectations": len(report.results),
            "failed": dg.MetadataValue.json(report.to_dict()["results"] if not report.success else []),
        },
    )


def _build(config: SnapshotConfig, platform: PlatformResource, day: date) -> tuple[DatedSnapshot, OwnFiles | None]:
    """The day's snapshot, and for a file source with expectations: its files' rows and those expectations."""
    root = platform.paths().snapshots
    if config.dataset is None:
        if is_file_uri(config.source):
            raise SpecError(
                f"dataset_snapshot config: source {config.source} is your own files; say how to read them in "
                'config.dataset, e.g. {"source": "...", "columns": {"label": "target"}} (tp train does)'
            )
        landing = landing_for(platform, config.landing_dir)
        return build_snapshot_as_of(config.source, root, as_of=day, landing=landing), None
    dataset = _dataset_from_json(config.dataset)
    if dataset.source != config.source or dataset.columns is None:
        raise SpecError(
            f"dataset_snapshot config: dataset.source {dataset.source} is not the source {config.source}, or names "
            "no columns; give the spec's dataset section for the source being built"
        )
    source = FileSource(uri=dataset.source, columns=dataset.columns, split=dataset.split or FileSplit())
    manifest = build_file_snapshot(source, root, outside=platform.paths().root).manifest
    built = DatedSnapshot(manifest=manifest, as_of=None)
    if dataset.expectations is None:
        return built, None
    # Checked on the files' own rows (their names, the label as text, keys): read again, a second parse.
    return built, (read_source_table(source).to_pandas(), dataset.expectations)


def _dataset_from_json(raw: str) -> DatasetSpec:
    where = "dataset_snapshot config: dataset"
    try:
        return DatasetSpec.model_validate(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not JSON ({exc}); give the spec's dataset section as JSON") from None
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, DatasetSpec, where)) from None


def refuse_failed_snapshot(instance: dg.DagsterInstance, snapshot_id: str) -> None:
    """A snapshot named by id (a spec's dataset.snapshot_id, a sweep's trials) trains only if its newest verdict
    passed. A snapshot no check ever saw (built outside the asset, as tests do) is not refused."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=ASSET_KEY), limit=1000).records
    for record in records:  # newest first
        metadata = record.asset_materialization.metadata
        if "snapshot_id" not in metadata or metadata["snapshot_id"].value != snapshot_id:
            continue
        if "expectations_passed" in metadata and not metadata["expectations_passed"].value:
            raise SpecError(
                f"dataset.snapshot_id: snapshot {snapshot_id} failed its expectations (dataset_snapshot "
                f"{record.asset_materialization.partition}); `tp snapshots show {snapshot_id[:12]}` says which, fix "
                "the data and train on the snapshot that passes"
            )
        return


def resolve_snapshot_id(instance: dg.DagsterInstance, source: str | None, as_of: date | None) -> str:
    """The snapshot id a run trains on: the day `as_of` (else the newest day built) of `source`.

    Only the newest materialization of a day whose source matches counts, and it must have passed its
    expectations: a demo built from sklearn_digits today does not feed a digits_daily run.
    """
    days = [as_of.isoformat()] if as_of else sorted(instance.get_materialized_partitions(ASSET_KEY), reverse=True)
    for day in days:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=ASSET_KEY, asset_partitions=[day]), limit=50
        ).records
        for record in records:
            metadata = record.asset_materialization.metadata
            if source is not None and "source" in metadata and metadata["source"].value != source:
                continue
            if "expectations_passed" in metadata and not metadata["expectations_passed"].value:
                raise SpecError(
                    f"dataset: the {day} snapshot {metadata['snapshot_id'].value} failed its expectations; "
                    "fix the drop and rebuild that dataset_snapshot partition"
                )
            return str(metadata["snapshot_id"].value)
    if as_of is not None:
        raise SpecError(
            f"dataset.as_of: no dataset_snapshot of {source or 'any source'} for {as_of} yet; materialize that "
            f"partition first (tp retrain does) or pick a built day"
        )
    # Snapshots built before the asset was partitioned by day.
    event = instance.get_latest_materialization_event(ASSET_KEY)
    if event is None or event.asset_materialization is None or event.asset_materialization.partition:
        raise SpecError(
            f"dataset: no dataset_snapshot of {source or 'any source'} has been materialized yet; materialize it "
            "first (tp train does) or set dataset.snapshot_id"
        )
    return str(event.asset_materialization.metadata["snapshot_id"].value)
