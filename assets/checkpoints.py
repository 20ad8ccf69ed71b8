"""The checkpoints asset: a run's checkpoint manifests, with a check that the newest restores."""

import dagster as dg

from assets.partitions import training_runs
from training_platform.checkpoints import open_store
from training_platform.train.weights import weights_sha256


def _table(checkpoints: list[dict]) -> dg.TableMetadataValue:
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn("step", "int"),
            dg.TableColumn("bytes", "int"),
            dg.TableColumn("sha256", "string"),
            dg.TableColumn("uri", "string"),
        ]
    )
    rows = [dg.TableRecord({k: c[k] for k in ("step", "bytes", "sha256", "uri")}) for c in checkpoints]
    return dg.MetadataValue.table(rows, schema=schema)


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"pytorch"},
    description="The run's checkpoints: manifests (URI, step, bytes, sha256) in the checkpoint store.",
    # The check runs inside the asset: a standalone asset check would load every partition at once.
    check_specs=[
        dg.AssetCheckSpec(
            "newest_checkpoint_restores",
            asset="checkpoints",
            description="The newest checkpoint verifies and restores the run's final weights.",
        )
    ],
)
def checkpoints(context: dg.AssetExecutionContext, training_run: dict):
    store = open_store(training_run["store_uri"])
    key = training_run["checkpoint_key"]
    manifests = [m.summary() for m in store.list(key)]
    final = next((m for m in manifests if m["step"] == training_run["final_step"]), None)
    if final is None:
        raise dg.Failure(
            description=f"run {training_run['run_id']} has no checkpoint at its final step "
            f"{training_run['final_step']} in {store.uri}; re-run the training_run partition"
        )
    value = {
        "run_id": training_run["run_id"],
        "checkpoint_key": key,
        "store_uri": training_run["store_uri"],
        "checkpoints": manifests,
        "final": final,
        "final_weights_sha256": training_run["final_weights_sha256"],
    }
    metadata = {
        "checkpoints": _table(manifests),
        "count": len(manifests),
        "total_bytes": sum(m["bytes"] for m in manifests),
        "final_step": final["step"],
        "final_checkpoint": final["uri"],
    }
    yield dg.Output(value, metadata=metadata, data_version=dg.DataVersion(final["sha256"]))
    yield newest_checkpoint_restores(value)


def newest_checkpoint_restores(checkpoints: dict) -> dg.AssetCheckResult:
    store = open_store(checkpoints["store_uri"])
    restored = store.restore_latest(checkpoints["checkpoint_key"])
    if restored is None:
        return dg.AssetCheckResult(
            check_name="newest_checkpoint_restores", passed=False, description="no checkpoint of this run verifies"
        )
    restored_sha = weights_sha256(restored.state["user"]["model"])
    matches_final = restored.manifest.step != checkpoints["final"]["step"] or (
        restored_sha == checkpoints["final_weights_sha256"]
    )
    return dg.AssetCheckResult(
        check_name="newest_checkpoint_restores",
        passed=not restored.skipped and matches_final,
        description=(
            f"step {restored.manifest.step} restored"
            + (f"; skipped {restored.skipped}" if restored.skipped else "")
            + ("" if matches_final else "; its weights differ from the run's final weights")
        ),
        metadata={"step": restored.manifest.step, "weights_sha256": restored_sha, "uri": restored.manifest.uri},
    )
