"""Checkpoint storage of the platform home: pins, tiering and GC on a schedule, figures in the UI."""

import dagster as dg

from resources.platform import PlatformResource
from training_platform.lifecycle.collect import run_lifecycle
from training_platform.lifecycle.settings import load_settings


@dg.asset(
    group_name="storage",
    kinds={"storage"},
    description="The home's checkpoint stores after a lifecycle pass: model pins re-derived from the registry, "
    "old checkpoints moved to the cold tier, chunks no kept checkpoint needs collected (tp gc does the same).",
)
def checkpoint_storage(context: dg.AssetExecutionContext, platform: PlatformResource) -> dg.MaterializeResult:
    home = platform.paths()
    report = run_lifecycle(
        home, load_settings(home.root), platform.mlflow_uri(), default_store_uri=platform.store_uri_for(None)
    )
    for store in report.stores:
        if store.error:
            context.log.error(f"{store.uri}: {store.error}")
            continue
        gc = store.gc
        context.log.info(
            f"{store.uri}: freed {gc.deleted_bytes} bytes in {gc.deleted_chunks} chunks of {gc.stored_bytes}; "
            f"moved to {store.cold_uri or 'no cold tier'}: {store.tiered or 'nothing'}"
        )
    failed = [store.uri for store in report.stores if store.error]
    if failed:
        raise dg.Failure(
            description=f"checkpoint lifecycle failed for {', '.join(failed)}; the other stores were collected. "
            "See the run log for why, and run `tp gc --dry-run` to check a fix",
            metadata={"report": dg.MetadataValue.json(report.as_dict())},
        )
    stored = sum(store.gc.stored_bytes for store in report.stores)
    return dg.MaterializeResult(
        metadata={
            "freed_bytes": report.freed_bytes,
            "freed_chunks": report.freed_chunks,
            "stored_bytes_after": stored - report.freed_bytes,
            "stores": len(report.stores),
            "moved_to_cold": sum(len(steps) for store in report.stores for steps in store.tiered.values()),
            "registry": report.registry_error or "read",
            "report": dg.MetadataValue.json(report.as_dict()),
        }
    )


checkpoint_lifecycle_job = dg.define_asset_job(
    "checkpoint_lifecycle_job",
    selection=dg.AssetSelection.assets(checkpoint_storage),
    description="Pins, tiering and GC of every checkpoint store of the platform home.",
    executor_def=dg.in_process_executor,
)
