"""The sweep asset: one partition per sweep; each trial is a `training_run` partition of its own.

Materializing a sweep's partition (`tp sweep`, the UI, the hourly window schedule) records the sweep
and either leaves it QUEUED for its cost window or starts it: pins its snapshot (one that passed its
expectations), checks the team's budget, opens the parent MLflow run and marks it RUNNING. From then on
the server's sweep sensor (sensors/sweeps.py) submits the trials as queued training runs and, once the
sweep is over, records its results as the partition's next materialization. The run that starts a
sweep takes seconds: it holds no queue slot while the trials train.
"""

import json
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from resources.platform import PlatformResource
from training_platform.cost import check_budget
from training_platform.cost.budgets import sweep_estimate_usd
from training_platform.errors import SpecError
from training_platform.sweeps import QueuedSweep, SweepDriver, SweepQueue, SweepSpec, load_sweep, parse_sweep
from training_platform.sweeps.parent_run import start_parent_run
from training_platform.sweeps.queue import sweep_window, waits_for_window

sweeps = dg.DynamicPartitionsDefinition(name="sweeps")
SCHEDULE_TAG = "dagster/schedule_name"


class SweepConfig(dg.Config):
    sweep_spec: str | None = Field(None, description="the sweep to record (JSON); `tp sweep` sets it")
    sweep_file: str | None = Field(
        None, description="a sweep YAML to (re)load, from the UI; default: the sweep recorded under this partition"
    )
    now: bool = Field(False, description="start now, even when a deadline leaves a cheaper window later")


@dg.asset(
    partitions_def=sweeps,
    group_name="sweeps",
    kinds={"optuna"},
    # Any day may be the input: the sweep pins the newest passed snapshot of its source when it starts.
    deps=[dg.AssetDep("dataset_snapshot", partition_mapping=dg.AllPartitionMapping())],
    description="A hyper-parameter sweep (Optuna study, RDB storage): trials are queued training_run partitions.",
)
def sweep(context: dg.AssetExecutionContext, config: SweepConfig, platform: PlatformResource) -> dg.MaterializeResult:
    home = platform.paths()
    queue = SweepQueue(home.root)
    name = context.partition_key
    loaded = _loaded(config, name)
    current = queue.get(name)
    if current is not None and current.state == "RUNNING":
        context.log.info(f"sweep {name} is running already; its trials go on")
        return dg.MaterializeResult(metadata=_metadata(current))
    if loaded is not None:
        current = queue.enqueue(loaded, sweep_window(loaded))
    if current is None:
        raise SpecError(f"sweep {name!r} is not recorded; submit it with `tp sweep FILE`")
    released = config.now or SCHEDULE_TAG in context.run.tags
    if not released and waits_for_window(current.sweep, sweep_window(current.sweep), datetime.now(UTC)):
        context.log.info(f"sweep {name} waits for its window from {current.window['start']}")
        return dg.MaterializeResult(metadata=_metadata(current))
    spec = _with_snapshot(context, current.sweep)
    check_budget(home.root, spec.team, sweep_estimate_usd(spec, home.root), stage="started")
    parent = start_parent_run(platform.mlflow_uri(), home.mlflow_artifacts, spec)
    SweepDriver.start(spec, home, parent)  # the study exists before the sweep sensor first steps it
    # A sweep with a deadline runs in its cost window: no trial is released after the window ends.
    in_window = spec.deadline is not None and not config.now
    queue.start(spec, parent, trials_until=current.end if in_window else None)
    running = queue.get(name)
    limits = spec.limits
    context.log.info(f"sweep {name} started: up to {limits.max_trials} trials, {limits.parallel_trials} at once")
    return dg.MaterializeResult(metadata=_metadata(running))  # type: ignore[arg-type]


def _loaded(config: SweepConfig, name: str) -> SweepSpec | None:
    if config.sweep_spec:
        loaded = parse_sweep(_json(config.sweep_spec), source="sweep config: sweep_spec")
    elif config.sweep_file:
        loaded = load_sweep(config.sweep_file)
    else:
        return None
    if loaded.name != name:
        raise SpecError(f"sweep name {loaded.name!r} differs from partition {name!r}; pick the partition named like it")
    return loaded


def _json(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecError(f"sweep config: sweep_spec is not JSON ({exc}); submit sweeps with `tp sweep FILE`") from None


def _with_snapshot(context: dg.AssetExecutionContext, spec: SweepSpec) -> SweepSpec:
    """The sweep with its base pinned to a snapshot that passed its expectations (every trial trains on it)."""
    from assets.datasets import resolve_snapshot_id

    base = spec.base_spec
    if base.dataset.snapshot_id:
        return spec
    snapshot = resolve_snapshot_id(context.instance, base.dataset.source, base.dataset.as_of)
    return spec.model_copy(update={"base": {**spec.base, "dataset": {"snapshot_id": snapshot}}})


def _metadata(queued: QueuedSweep) -> dict:
    window = queued.window
    return {
        "state": queued.state,
        "team": queued.sweep.team,
        "max_trials": queued.sweep.limits.max_trials,
        "parallel_trials": queued.sweep.limits.parallel_trials,
        "window_start": window.get("start"),
        "window_expected_cost_usd": window.get("expected_cost"),
        "window_saving_vs_now_usd": window.get("saving"),
        "parent_mlflow_run_id": queued.parent_mlflow_run_id or "",
    }


sweep_job = dg.define_asset_job(
    "sweep_job",
    selection=dg.AssetSelection.assets(sweep),
    partitions_def=sweeps,
    description="Record and start one sweep (a `sweeps` partition); released by the hourly cost-window schedule.",
    executor_def=dg.in_process_executor,
)
