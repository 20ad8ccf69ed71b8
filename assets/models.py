"""Evaluated and registered models: test-split evaluation, then the MLflow registry behind a gate."""

import dagster as dg

from assets.partitions import training_runs
from resources.platform import PlatformResource
from training_platform.checkpoints import open_store
from training_platform.lifecycle.registry import model_pin_reason
from training_platform.registry import tracking
from training_platform.registry.champion import remeasure
from training_platform.registry.evaluate import evaluate_checkpoint, find_checkpoint, input_example, load_model
from training_platform.registry.script_evaluation import evaluate_script
from training_platform.registry.tracking import metric_tag
from training_platform.spec import parse_spec
from training_platform.state.backends import shared_lock


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"pytorch"},
    description="The spec's test metrics (default: accuracy and loss) on the held-out test split of the run's "
    "snapshot, from its final (lineage-linked) checkpoint; a user's script measures its own model.",
)
def evaluated_model(training_run: dict, checkpoints: dict, platform: PlatformResource) -> dg.Output[dict]:
    spec = parse_spec(training_run["spec"])
    final = checkpoints["final"]
    manifest = find_checkpoint(checkpoints["store_uri"], checkpoints["checkpoint_key"], final["step"], final["sha256"])
    tracking_uri = platform.mlflow_uri()
    if spec.entrypoint is not None:  # the user's own script measures (and logs) its model
        script = evaluate_script(
            platform.paths(),
            spec,
            training_run["run_id"],
            manifest,
            checkpoints["store_uri"],
            tracking_uri=tracking_uri,
            log_model_to=training_run["mlflow_run_id"],
        )
        metrics, weights, test_rows = script.metrics, script.weights_sha256, script.test_rows
        measured = {"model_uri": script.model_uri}
    else:
        evaluation, _ = evaluate_checkpoint(spec, platform.paths().snapshots, checkpoints["store_uri"], manifest)
        metrics = evaluation.metrics
        weights, test_rows = evaluation.weights_sha256, evaluation.test_rows
        measured = {}
    if weights != training_run["final_weights_sha256"]:
        raise dg.Failure(
            description=f"checkpoint {manifest.uri} does not hold the run's final weights; re-run the partition"
        )
    tested = {metric_tag(name): value for name, value in metrics.items()}
    tracking.log_metrics(tracking_uri, training_run["mlflow_run_id"], tested)
    value = {
        **tested,
        **measured,
        "metrics": metrics,
        "test_rows": test_rows,
        "snapshot_id": spec.dataset.snapshot_id,
        "weights_sha256": weights,
        "checkpoint_uri": manifest.uri,
        "checkpoint_step": manifest.step,
        "run_id": training_run["run_id"],
        "checkpoint_key": checkpoints["checkpoint_key"],
        "store_uri": checkpoints["store_uri"],
        "checkpoint_sha256": manifest.manifest_sha256,
    }
    metadata = {
        **tested,
        "test_rows": test_rows,
        "test_split_of": spec.dataset.snapshot_id or "",
        "checkpoint": manifest.uri,
        "checkpoint_step": manifest.step,
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
    metrics = _metrics(evaluated_model)
    lineage = training_run["lineage"]
    split = evaluated_model.get("snapshot_id") or lineage["snapshot_id"]  # the snapshot whose test split measured it
    tags = {
        "training_run": training_run["run_id"],
        **{metric_tag(name): f"{value:.6f}" for name, value in metrics.items()},
        "test_split_of": split,
        "weights_sha256": training_run["final_weights_sha256"],
        "checkpoint_uri": manifest.uri,
        **{k: str(v) for k, v in lineage.items()},
    }
    if spec.entrypoint is not None:  # logged by the script's evaluation, which measured it
        version = tracking.register_logged_model(tracking_uri, evaluated_model["model_uri"], model_name, tags)
    else:
        snapshots = platform.paths().snapshots
        model = load_model(spec, snapshots, store_uri, manifest)
        example = input_example(spec, snapshots)
        version = tracking.register_model(tracking_uri, training_run["mlflow_run_id"], model_name, model, example, tags)
    gate = tracking.promote(
        tracking_uri,
        training_run["mlflow_run_id"],
        model_name,
        version,
        metrics,
        spec.evaluated.gate,
        shared_lock(platform.paths().root, "registry", model_name),
        split,
        lambda champion_tags: remeasure(platform.paths(), champion_tags, split),
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
        "metrics": metrics,
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


def _metrics(evaluated_model: dict) -> dict[str, float]:
    """The evaluation's metrics (a value materialized before they were kept as a whole had accuracy and loss)."""
    if "metrics" in evaluated_model:
        return evaluated_model["metrics"]
    return {"accuracy": evaluated_model["test_accuracy"], "loss": evaluated_model["test_loss"]}
