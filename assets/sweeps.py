"""The sweep asset: one partition per sweep; each trial is a `training_run` partition of its own.

The sweep's spec and cost window are in the sweep queue (`tp sweep` writes them); the hourly
release schedule starts this asset inside the window. Trials are materialized one Dagster run
each, so every trial has its own lineage, checkpoints, cost and MLflow run (nested under the sweep's).
"""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import dagster as dg
from pydantic import Field

from assets.partitions import training_runs
from assets.training import training_run
from resources.launcher import LauncherResource
from resources.platform import PlatformResource
from training_platform.cost import check_budget
from training_platform.errors import SpecError
from training_platform.paths import PlatformHome
from training_platform.sweeps import SweepQueue, SweepResult, SweepSpec, load_sweep, run_sweep
from training_platform.sweeps.parent_run import end_parent_run, start_parent_run
from training_platform.sweeps.queue import queue_tags, sweep_window

sweeps = dg.DynamicPartitionsDefinition(name="sweeps")


class SweepConfig(dg.Config):
    sweep_file: str | None = Field(
        None, description="a sweep YAML to (re)load and start now, from the UI; default: the queued sweep"
    )


def sweep_estimate_usd(sweep: SweepSpec) -> float:
    return sweep.limits.max_usd or 0.0


def materialize_trial(instance: dg.DagsterInstance, run_id: str, resources: dict, tags: dict[str, str]) -> str | None:
    """One trial as one Dagster run of `training_run`; the failure text, or None when it ran."""
    instance.add_dynamic_partitions(training_runs.name, [run_id])
    result = dg.materialize(
        [training_run],
        partition_key=run_id,
        instance=instance,
        resources=resources,
        raise_on_error=False,
        tags=tags,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
    )
    if result.success:
        return None
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data.error:
            return event.step_failure_data.error.message.strip()
    return f"Dagster run {result.run_id} failed"


def run_sweep_in_dagster(
    sweep: SweepSpec,
    home: PlatformHome,
    instance: dg.DagsterInstance,
    resources: dict,
    tracking_uri: str,
    log=None,
) -> SweepResult:
    """Budget check, parent MLflow run, then every trial through Dagster; shared by the asset and `tp sweep`."""
    check_budget(home.root, sweep.team, sweep_estimate_usd(sweep))
    parent = start_parent_run(tracking_uri, home.mlflow_artifacts, sweep)
    tags = queue_tags(sweep.team, sweep.base_spec.resources.priority, sweep=sweep.name)
    parallel = sweep.limits.parallel_trials
    # In-process Dagster runs deadlock on logging locks when started from several threads, so
    # parallel trials each run in a child process (spawned once, reused) on the same instance.
    pool = None
    if parallel > 1 and not instance.is_ephemeral:
        pool = ProcessPoolExecutor(parallel, mp_context=multiprocessing.get_context("spawn"))

    def run_trial(spec, run_id):
        if pool is None:
            return materialize_trial(instance, run_id, resources, tags)
        return pool.submit(_materialize_trial_in_child, run_id, _portable(resources), tags).result()

    def on_trial(outcome) -> None:
        if log is not None:
            log(f"trial {outcome.number} ({outcome.run_id}): {outcome.state} value={outcome.value} "
                f"steps={outcome.steps}")

    try:
        result = run_sweep(sweep, home, run_trial, parent_mlflow_run_id=parent, on_trial=on_trial)
    finally:
        if pool is not None:
            pool.shutdown()
    end_parent_run(tracking_uri, parent, result)
    return result


def _portable(resources: dict) -> dict:
    """Resources as (class, field values): resource objects themselves do not pickle."""
    return {key: (type(r), {f: getattr(r, f) for f in type(r).model_fields}) for key, r in resources.items()}


def _materialize_trial_in_child(run_id: str, resources: dict, tags: dict[str, str]) -> str | None:
    built = {key: cls(**fields) for key, (cls, fields) in resources.items()}
    with dg.DagsterInstance.get() as instance:  # $DAGSTER_HOME, inherited from the parent
        return materialize_trial(instance, run_id, built, tags)


@dg.asset(
    partitions_def=sweeps,
    group_name="sweeps",
    kinds={"optuna"},
    # Any day may be the input: the run picks its snapshot when it starts (dataset.as_of, else the newest day).
    deps=[dg.AssetDep("dataset_snapshot", partition_mapping=dg.AllPartitionMapping())],
    description="A hyper-parameter sweep (Optuna study, RDB storage): trials are training_run partitions.",
)
def sweep(
    context: dg.AssetExecutionContext, config: SweepConfig, platform: PlatformResource, launcher: LauncherResource
) -> dg.Output[dict]:
    home = platform.paths()
    queue = SweepQueue(home.root)
    if config.sweep_file:
        loaded = load_sweep(config.sweep_file)
        if loaded.name != context.partition_key:
            raise SpecError(f"{config.sweep_file}: sweep name {loaded.name!r} differs from partition "
                            f"{context.partition_key!r}; pick the partition named like the sweep")
        queue.enqueue(loaded, sweep_window(loaded))
    queued = queue.get(context.partition_key)
    if queued is None:
        raise SpecError(f"sweep {context.partition_key!r} is not in the sweep queue; submit it with `tp sweep FILE`")
    spec = queued.sweep
    if not spec.base.get("dataset", {}).get("snapshot_id"):
        event = context.instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
        if event is None or event.asset_materialization is None:
            raise SpecError("no dataset_snapshot materialized yet; materialize it or set base.dataset.snapshot_id")
        snapshot = str(event.asset_materialization.metadata["snapshot_id"].value)
        spec = spec.model_copy(update={"base": {**spec.base, "dataset": {"snapshot_id": snapshot}}})
    queue.mark(spec.name, "RELEASED")
    result = run_sweep_in_dagster(
        spec, home, context.instance, {"platform": platform, "launcher": launcher}, platform.mlflow_uri(),
        log=context.log.info,
    )
    summary = result.as_dict()
    table = "\n".join(
        ["| trial | run | state | value | steps | cost $ |", "|---|---|---|---|---|---|"]
        + [f"| {t.number} | {t.run_id} | {t.state} | {t.value} | {t.steps} | {t.cost_usd:.4f} |" for t in result.trials]
    )
    window = queued.window
    metadata = {
        "trials": summary["trials"],
        "pruned": summary["pruned"],
        "failed": summary["fail"],
        "total_steps": summary["total_steps"],
        "total_cost_usd": summary["total_cost_usd"],
        "best_value": summary["best_value"],
        "best_run_id": summary["best_run_id"],
        "best_params": dg.MetadataValue.json(summary["best_params"] or {}),
        "best_spec": dg.MetadataValue.json(summary["best_spec"] or {}),
        "trial_table": dg.MetadataValue.md(table),
        "window_start": window.get("start"),
        "window_expected_cost_usd": window.get("expected_cost"),
        "window_saving_vs_now_usd": window.get("saving"),
        "parent_mlflow_run_id": summary["parent_mlflow_run_id"],
    }
    return dg.Output(summary, metadata=metadata)


sweep_job = dg.define_asset_job(
    "sweep_job",
    selection=dg.AssetSelection.assets(sweep),
    partitions_def=sweeps,
    description="Run one sweep (a `sweeps` partition); released by the hourly cost-window schedule.",
)
