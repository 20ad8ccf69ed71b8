"""The dataset snapshot asset and its blocking Great Expectations check."""

import dagster as dg
from pydantic import Field

from resources.platform import PlatformResource
from training_platform.datasets import build_snapshot, validate_snapshot


class SnapshotConfig(dg.Config):
    source: str = Field("sklearn_digits", description="registered data source to snapshot")


@dg.asset(group_name="training", kinds={"parquet"}, description="Immutable, content-addressed dataset snapshot.")
def dataset_snapshot(context: dg.AssetExecutionContext, config: SnapshotConfig, platform: PlatformResource):
    root = platform.paths().snapshots
    manifest = build_snapshot(config.source, root)
    context.log.info(f"snapshot {manifest.snapshot_id} from {config.source}: {manifest.rows}")
    summary = manifest.summary()
    metadata = {
        "snapshot_id": manifest.snapshot_id,
        "source": manifest.source,
        "source_sha256": manifest.source_sha256,
        "rows": dg.MetadataValue.json(summary["rows"]),
        "shards": summary["shards"],
        "bytes": summary["bytes"],
        "manifest": dg.MetadataValue.path(str(root / f"{manifest.snapshot_id}.json")),
        "schema": dg.MetadataValue.table_schema(
            dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in manifest.schema.items()])
        ),
    }
    return dg.Output(summary, metadata=metadata, data_version=dg.DataVersion(manifest.snapshot_id))


@dg.asset_check(
    asset=dataset_snapshot,
    blocking=True,
    description="Great Expectations suite: schema, value ranges, no nulls, class balance, disjoint splits.",
)
def dataset_snapshot_expectations(platform: PlatformResource, dataset_snapshot: dict) -> dg.AssetCheckResult:
    report = validate_snapshot(platform.paths().snapshots, dataset_snapshot["snapshot_id"])
    return dg.AssetCheckResult(
        passed=report.success,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.summary(),
        metadata={
            "snapshot_id": dataset_snapshot["snapshot_id"],
            "expectations": len(report.results),
            "failed": dg.MetadataValue.json(report.to_dict()["results"] if not report.success else []),
        },
    )
