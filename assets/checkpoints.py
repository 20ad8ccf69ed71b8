"""The checkpoints asset: a run's checkpoint manifests, with a check that the newest restores."""

import tempfile
from pathlib import Path

import dagster as dg

from assets.partitions import training_runs
from training_platform.checkpoints import open_store
from training_platform.errors import CheckpointError
from training_platform.train.strategies.consolidate import full_model_state
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
    """Every chunk of the newest checkpoint verifies; its weights are the run's final weights."""
    store = open_store(checkpoints["store_uri"])
    manifests = store.list(checkpoints["checkpoint_key"])
    if not manifests:
        return _restores(False, "the run has no checkpoint in the store", {})
    newest = manifests[-1]
    try:
        if newest.kind == "files":  # every file's chunks verify: bytes only, nothing is unpickled here
            with tempfile.TemporaryDirectory() as scratch:
                store.restore_files(newest, Path(scratch))
        if newest.attributes.get("format") == "directory":  # a framework's own files (HF, Lightning)
            return _restores(True, f"step {newest.step} restored (framework files)", {"uri": newest.uri})
        restored_sha = weights_sha256(full_model_state(store, newest))
    except (CheckpointError, OSError, KeyError, ValueError) as exc:
        return _restores(False, f"step {newest.step} does not restore: {exc}", {"uri": newest.uri})
    matches_final = newest.step != checkpoints["final"]["step"] or restored_sha == checkpoints["final_weights_sha256"]
    return _restores(
        matches_final,
        f"step {newest.step} restored" + ("" if matches_final else "; its weights differ from the run's final weights"),
        {"step": newest.step, "weights_sha256": restored_sha, "uri": newest.uri},
    )


def _restores(passed: bool, description: str, metadata: dict) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name="newest_checkpoint_restores", passed=passed, description=description, metadata=metadata
    )
