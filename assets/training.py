"""The training_run asset: one partition per run, launched through the launcher resource."""

import dagster as dg
from pydantic import Field

from assets.partitions import training_runs
from resources.launcher import LauncherResource
from resources.platform import PlatformResource
from training_platform import tracking
from training_platform.cost.accounting import record_run_cost
from training_platform.launch import JobState, RunRequest
from training_platform.errors import SpecError
from training_platform.lineage import LineageKey
from training_platform.preemption import summarize
from training_platform.preflight import preflight
from training_platform.runlog import RunEvents
from training_platform.runs import load_run_spec, read_result
from training_platform.spec import parse_spec
from training_platform.sweeps.trial import TrialContext


class TrainingRunConfig(dg.Config):
    backend: str | None = Field(None, description="run on this backend instead of the one the spec names")
    capacity: str | None = Field(
        None, description="spot or ondemand: overrides resources.spot (the preemption sensor sets ondemand)"
    )


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"pytorch"},
    description="One training run: the worker launched by torchrun, Slurm or Kubernetes, followed via Pipes.",
    deps=["dataset_snapshot"],
)
def training_run(
    context: dg.AssetExecutionContext,
    config: TrainingRunConfig,
    platform: PlatformResource,
    launcher: LauncherResource,
) -> dg.Output[dict]:
    home = platform.paths()
    run_id = context.partition_key
    spec = load_run_spec(home, run_id)
    spec = spec.with_snapshot(spec.dataset.snapshot_id or _latest_snapshot_id(context))
    store_uri = platform.store_uri_for(spec.checkpoint.store_uri)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"store_uri": store_uri})})
    if config.backend:
        spec = parse_spec({**spec.model_dump(mode="json"), "backend": config.backend}, source="run config")
    if config.capacity:
        if config.capacity not in ("spot", "ondemand"):
            raise SpecError(f"run config capacity: {config.capacity!r} is not spot or ondemand")
        spec = spec.model_copy(
            update={"resources": spec.resources.model_copy(update={"spot": config.capacity == "spot"})}
        )
    preflight(spec, home, store_uri)

    lineage = LineageKey.of(spec)
    tracking_uri = platform.mlflow_uri()
    tags = tracking.run_tags(spec, lineage, context.run_id, run_id)
    trial = TrialContext.read(home.run_dir(run_id))  # set when this run is a sweep trial
    tags.update(trial.mlflow_tags() if trial else {})
    mlflow_run_id = tracking.start_run(tracking_uri, home.mlflow_artifacts, spec, tags)
    context.log.info(f"MLflow run {mlflow_run_id} in experiment {tracking.experiment_name(spec)}")

    run_dir = home.run_dir(run_id)
    (run_dir / "result.json").unlink(missing_ok=True)
    request = RunRequest(
        spec=spec,
        run_id=run_id,
        run_dir=run_dir,
        env={"TP_HOME": str(home.root), "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": mlflow_run_id}
        | (trial.worker_env() if trial else {}),
    )
    outcome = launcher.run(context, request)
    result = read_result(home, run_id)
    succeeded = outcome.status.state == JobState.SUCCEEDED and result is not None
    tracking.end_run(tracking_uri, mlflow_run_id, succeeded)
    preemptions = summarize(RunEvents(run_dir).read())
    if outcome.status.state == JobState.PREEMPTED:
        raise dg.Failure(
            description=f"training run {run_id} was preempted ({outcome.status.reason}); its emergency checkpoint "
            "is in the store and the preemption sensor resumes it",
            metadata={"preempted": True, **_preemption_metadata(preemptions)},
        )
    if not succeeded:
        raise dg.Failure(
            description=f"training run {run_id} ended {outcome.status.state}: {outcome.status.reason}",
            metadata={"job_id": outcome.job_id, "log_tail": dg.MetadataValue.md(f"```\n{outcome.logs_tail}\n```")},
        )

    reported = {}
    for pipes_result in outcome.pipes_results:
        reported.update(getattr(pipes_result, "metadata", None) or {})
    metadata = {
        **reported,
        "mlflow_run_id": mlflow_run_id,
        "final_step": result["final_step"],
        "final_weights_sha256": result["final_weights_sha256"],
        "lineage": dg.MetadataValue.json(lineage.as_dict()),
        "snapshot_id": spec.dataset.snapshot_id,
        "spec_hash": lineage.spec_hash,
        "code_commit": lineage.code_commit,
        "checkpoint_store": store_uri,
        "checkpoints": len(result["checkpoints"]),
        **_preemption_metadata(preemptions),
    }
    cost = record_run_cost(home.root, spec, run_id, result, preemptions.metadata()["lost_steps"], trial and trial.sweep)
    metadata.update(cost.as_metadata(), status=result.get("status", "SUCCEEDED"))  # PRUNED for pruned trials
    value = {**result, "spec": spec.model_dump(mode="json"), "lineage": lineage.as_dict(), "store_uri": store_uri}
    return dg.Output(value, metadata=metadata, data_version=dg.DataVersion(result["final_weights_sha256"]))


def _preemption_metadata(summary) -> dict:
    figures = summary.metadata()
    return {
        "preemptions": figures["preemptions"],
        "lost_steps": figures["lost_steps"],
        "recovery_seconds_median": figures["recovery_seconds_median"],
        "interruptions": dg.MetadataValue.json(figures["interruptions"]),
    }


def _latest_snapshot_id(context: dg.AssetExecutionContext) -> str:
    """The newest dataset_snapshot materialization, for specs that build from a source."""
    event = context.instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
    if event is None or event.asset_materialization is None:
        raise SpecError(
            "dataset: no dataset_snapshot has been materialized yet; materialize it first "
            "(tp train does) or set dataset.snapshot_id"
        )
    return str(event.asset_materialization.metadata["snapshot_id"].value)
