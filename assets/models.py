"""Evaluated and registered models: test-split evaluation, then the MLflow registry behind a gate."""

import dagster as dg

from assets.partitions import training_runs
from resources.platform import PlatformResource
from training_platform import tracking
from training_platform.checkpoints import open_store
from training_platform.documents import shared_lock
from training_platform.evaluate import evaluate_checkpoint, find_checkpoint, input_example, load_model
from training_platform.lifecycle.registry import model_pin_reason
from training_platform.spec import parse_spec


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"pytorch"},
    description="Accuracy and loss on the held-out test split, from the run's final (lineage-linked) checkpoint.",
)
def evaluated_model(training_run: dict, checkpoints: dict, platform: PlatformResource) -> dg.Output[dict]:
    spec = parse_spec(training_run["spec"])
    if spec.entrypoint is not None:
        code = spec.entrypoint.script or spec.entrypoint.module
        raise dg.Failure(
            description=f"run {training_run['run_id']} trained the user's own code ({code}): evaluation loads "
            "model templates; evaluate inside the script and report the test metrics, or materialize only "
            "training_run and checkpoints"
        )
    final = checkpoints["final"]
    manifest = find_checkpoint(checkpoints["store_uri"], checkpoints["checkpoint_key"], final["step"], final["sha256"])
    evaluation, _ = evaluate_checkpoint(spec, platform.paths().snapshots, checkpoints["store_uri"], manifest)
    if evaluation.weights_sha256 != training_run["final_weights_sha256"]:
        raise dg.Failure(
            description=f"checkpoint {manifest.uri} does not hold the run's final weights; re-run the partition"
        )
    tracking.log_metrics(
        platform.mlflow_uri(),
        training_run["mlflow_run_id"],
        {"test_accuracy": evaluation.test_accuracy, "test_loss": evaluation.test_loss},
    )
    value = {
        **evaluation.__dict__,
        "run_id": training_run["run_id"],
        "checkpoint_key": checkpoints["checkpoint_key"],
        "store_uri": checkpoints["store_uri"],
        "checkpoint_sha256": manifest.manifest_sha256,
    }
    metadata = {
        "test_accuracy": evaluation.test_accuracy,
        "test_loss": evaluation.test_loss,
        "test_rows": evaluation.test_rows,
        "checkpoint": evaluation.checkpoint_uri,
        "checkpoint_step": evaluation.checkpoint_step,
    }
    return dg.Output(value, metadata=metadata)


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"mlflow"},
    description="A model version in the MLflow registry; the champion alias moves only through the gate.",
)
def registered_model(
    context: dg.AssetExecutionContext, training_run: dict, evaluated_model: dict, platform: PlatformResource
) -> dg.Output[dict]:
    spec = parse_spec(training_run["spec"])
    tracking_uri = platform.mlflow_uri()
    model_name = spec.name
    store_uri = evaluated_model["store_uri"]
    manifest = find_checkpoint(
        store_uri,
        evaluated_model["checkpoint_key"],
        evaluated_model["checkpoint_step"],
        evaluated_model["checkpoint_sha256"],
    )
    snapshots = platform.paths().snapshots
    model = load_model(spec, snapshots, store_uri, manifest)
    example = input_example(spec, snapshots)
    lineage = training_run["lineage"]
    tags = {
        "training_run": training_run["run_id"],
        "test_accuracy": f"{evaluated_model['test_accuracy']:.6f}",
        "weights_sha256": training_run["final_weights_sha256"],
        "checkpoint_uri": manifest.uri,
        **{k: str(v) for k, v in lineage.items()},
    }
    version = tracking.register_model(tracking_uri, training_run["mlflow_run_id"], model_name, model, example, tags)
    gate = tracking.promote(
        tracking_uri,
        training_run["mlflow_run_id"],
        model_name,
        version,
        evaluated_model["test_accuracy"],
        shared_lock(platform.paths().root, "registry", model_name),
    )
    context.log.info(f"promotion gate: {'pass' if gate.promote else 'fail'}: {gate.reason}")
    # While the version exists, retention, tiering and GC keep its checkpoint (the lifecycle
    # schedule removes the pin once the version is deleted or archived).
    open_store(store_uri).pin(manifest.run_id, manifest.step, model_pin_reason(model_name, version))
    context.log.info(f"pinned checkpoint {manifest.uri} for {model_name} v{version}")
    value = {
        "model_name": model_name,
        "model_version": version,
        "promoted": gate.promote,
        "gate_reason": gate.reason,
        "test_accuracy": evaluated_model["test_accuracy"],
        "tracking_uri": tracking_uri,
    }
    metadata = {
        "model_name": model_name,
        "model_version": version,
        "promoted": gate.promote,
        "gate": gate.reason,
        "pinned_checkpoint": manifest.uri,
        "champion_before": gate.champion_version or "none",
    }
    return dg.Output(value, metadata=metadata)
