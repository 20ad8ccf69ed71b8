"""The training_run asset: one partition per run, launched through the launcher resource."""

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.partitions import training_runs
from resources.launcher import LauncherResource
from resources.platform import PlatformResource
from training_platform.cost.attempts import resume_step
from training_platform.cost.budgets import check_run_budget
from training_platform.cost.charges import record_storage_cost, run_money, settle
from training_platform.errors import PlatformError, SpecError
from training_platform.launch import JobState, RunRequest
from training_platform.policy.preflight import preflight
from training_platform.recovery.preemption import summarize
from training_platform.registry import tracking
from training_platform.runs.attempts import Attempt, begin_attempt, finish_attempt
from training_platform.runs.events import RunEvents
from training_platform.runs.lineage import LineageKey, environment_lock
from training_platform.runs.reproduce import compare
from training_platform.runs.specs import load_run_spec, read_result, register_submitted
from training_platform.spec import TrainSpec, parse_spec
from training_platform.spec.submission import FOLLOW_TAG, LEFT_JOB_TAG
from training_platform.sweeps.trial import TrialContext


class TrainingRunConfig(dg.Config):
    spec: str | None = Field(
        None,
        description="the run's TrainSpec as JSON: registers a new run under the partition's key (`tp train` sets "
        "it); a run registered before keeps the spec it was registered with",
    )
    backend: str | None = Field(None, description="run on this backend instead of the one the spec names")
    capacity: str | None = Field(
        None, description="spot or ondemand: overrides resources.spot (the preemption sensor sets ondemand)"
    )


@dg.asset(
    partitions_def=training_runs,
    group_name="training",
    kinds={"pytorch"},
    description="One training run: the worker launched by torchrun, Slurm or Kubernetes, followed via Pipes.",
    # Any day may be the input: the run picks its snapshot when it starts (dataset.as_of, else the newest day).
    deps=[dg.AssetDep("dataset_snapshot", partition_mapping=dg.AllPartitionMapping())],
    check_specs=[
        dg.AssetCheckSpec(
            "reproducibility",
            asset="training_run",
            description="First attempt: the run can be reproduced (committed code, pinned snapshot). A re-"
            "materialized (backfilled) run: it reproduces its original (bitwise weights on CPU, metrics within "
            "tolerance elsewhere), with a diff of code, packages, snapshot and device.",
        )
    ],
)
def training_run(
    context: dg.AssetExecutionContext,
    config: TrainingRunConfig,
    platform: PlatformResource,
    launcher: LauncherResource,
):
    home = platform.paths()
    run_id = context.partition_key
    run_dir = home.run_dir(run_id)
    if config.spec:
        register_submitted(home, run_id, config.spec)
    attempt = begin_attempt(run_dir, run_id)
    # A job whose Dagster run went down is followed, not launched again (launch/following.py); a reproduction trains
    # anew.
    take_over = (
        None
        if attempt.is_reproduction
        else launcher.job_to_take_over(context, run_dir, run_id, report_ended=FOLLOW_TAG in context.run.tags)
    )
    trial = TrialContext.read(home, run_id)  # set when this run is a sweep trial
    if take_over is not None:
        # What the job trains: resolved, checked and within budget when it was launched.
        launched = json.loads(RunRequest.spec_file(run_dir).read_text())
        spec = parse_spec(launched, source=f"run {run_id}'s launched spec")
        store_uri = spec.checkpoint.store_uri
    else:
        spec, store_uri = _spec_to_launch(context, config, platform, attempt, sweep_trial=trial is not None)

    lineage = LineageKey.of(spec)
    tracking_uri = platform.mlflow_uri()
    tags = tracking.run_tags(spec, lineage, context.run_id, run_id)
    tags.update(trial.mlflow_tags() if trial else {})
    if take_over is not None and take_over.mlflow_run_id:
        mlflow_run_id = take_over.mlflow_run_id  # the job logs there
    else:
        mlflow_run_id = tracking.start_run(tracking_uri, home.mlflow_artifacts, spec, tags)
    charged = _Charging(home.root, run_dir, run_id, spec, trial.sweep if trial else None, tracking_uri, mlflow_run_id)
    context.log.info(f"MLflow run {mlflow_run_id} in experiment {tracking.experiment_name(spec)}")

    request = RunRequest(
        spec=spec,
        run_id=run_id,
        run_dir=run_dir,
        env={
            "TP_HOME": str(home.root),
            "MLFLOW_TRACKING_URI": tracking_uri,
            "MLFLOW_RUN_ID": mlflow_run_id,
            "TP_CHECKPOINT_KEY": attempt.checkpoint_key,
        }
        | (trial.worker_env() if trial else {}),
    )
    try:
        outcome = launcher.run(context, request, take_over=take_over)
    except BaseException:  # terminated (the job was cancelled with it), the launch failed, or the job goes on
        charged.settle(context)  # whatever the attempts did, they are paid for
        if LEFT_JOB_TAG not in context.instance.get_run_by_id(context.run_id).tags:
            tracking.end_run(tracking_uri, mlflow_run_id, succeeded=False)  # else the run taking the job over ends it
        raise
    result = read_result(home, run_id)
    succeeded = outcome.status.state == JobState.SUCCEEDED and result is not None
    money = charged.settle(context, result if succeeded else None, attempt.checkpoint_key)
    tracking.end_run(tracking_uri, mlflow_run_id, succeeded)
    preemptions = summarize(RunEvents(run_dir).read())
    if outcome.status.state == JobState.PREEMPTED:
        raise dg.Failure(
            description=f"training run {run_id} was preempted ({outcome.status.reason}); its emergency checkpoint "
            "is in the store and the preemption sensor resumes it",
            metadata={"preempted": True, **_preemption_metadata(preemptions), **money},
        )
    if not succeeded:
        raise dg.Failure(
            description=f"training run {run_id} ended {outcome.status.state}: {outcome.status.reason}",
            metadata={
                "job_id": outcome.job_id,
                "log_tail": dg.MetadataValue.md(f"```\n{outcome.logs_tail}\n```"),
                **_preemption_metadata(preemptions),
                **money,
            },
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
        "tracking_uri": tracking_uri,
        "checkpoints": len(result["checkpoints"]),
        **_preemption_metadata(preemptions),
        **money,  # every attempt's dollars, badput and goodput, storage once finished
        "status": result.get("status", "SUCCEEDED"),  # PRUNED for pruned trials
    }
    value = {
        **result,
        "spec": spec.model_dump(mode="json"),
        "lineage": lineage.as_dict(),
        "store_uri": store_uri,
        "tracking_uri": tracking_uri,
        "environment": environment_lock(),
        "dagster_run_id": context.run_id,
    }
    finish_attempt(run_dir, value)
    yield dg.Output(value, metadata=metadata, data_version=dg.DataVersion(result["final_weights_sha256"]))
    yield _reproducibility(attempt, value)


def _spec_to_launch(
    context: dg.AssetExecutionContext,
    config: TrainingRunConfig,
    platform: PlatformResource,
    attempt: Attempt,
    sweep_trial: bool,
) -> tuple[TrainSpec, str]:
    """The spec a new job runs: the run's (its original's, for a reproduction) with its snapshot resolved, the
    run config's overrides and the team's defaults (a sweep trial's queue), checked against the team's budget; and
    its store's URI."""
    home = platform.paths()
    run_id = context.partition_key
    run_dir = home.run_dir(run_id)
    if attempt.is_reproduction:
        # Reproduce from the original's lineage: its resolved spec pins the snapshot it trained on.
        spec = parse_spec(attempt.original["spec"], source=f"run {run_id}'s original record")
        context.log.info(f"run {run_id} finished before: reproducing it from scratch ({attempt.checkpoint_key})")
    else:
        spec = load_run_spec(home, run_id)
        if spec.dataset.snapshot_id:  # named by id: its verdict counts as much as a resolved one's
            from assets.datasets import refuse_failed_snapshot

            refuse_failed_snapshot(context.instance, spec.dataset.snapshot_id)
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
    # The team's defaults filled in (a sweep trial in its team's sweep queue): launch what was checked.
    spec = preflight(spec, home, store_uri, sweep_trial=sweep_trial)
    # The one budget gate every entry point passes (tp, the UI, sensors, retrains, resumes, retries, trials):
    # a resume is estimated from the step it resumes at, a reproduction from scratch.
    from_step = 0 if attempt.is_reproduction else resume_step(RunEvents(run_dir).read())
    budget = check_run_budget(spec, home.root, from_step, stage="launched")
    if budget.budget_usd is not None:
        context.log.info(
            f"team {spec.team}: spent ${budget.spent_usd:.2f} of ${budget.budget_usd:.2f} this month; "
            f"this run is estimated at ${budget.estimate_usd:.2f}"
        )
    return spec, store_uri


@dataclass
class _Charging:
    """Charges the attempts a launch closed, and says what the run cost so far (metadata, MLflow)."""

    home_root: Path
    run_dir: Path
    run_id: str
    spec: TrainSpec
    sweep: str | None
    tracking_uri: str
    mlflow_run_id: str

    def settle(self, context: dg.AssetExecutionContext, result: dict | None = None, storage_key: str = "") -> dict:
        try:
            settle(self.home_root, self.run_dir, self.run_id, self.spec, self.sweep)
            if result is not None:  # a finished run's checkpoints, once
                record_storage_cost(self.home_root, self.spec, self.run_id, storage_key, result, self.sweep)
            money = run_money(self.home_root, self.run_id)
        except (OSError, ValueError, PlatformError) as exc:  # the preemption sensor settles it at its next tick
            context.log.warning(
                f"run {self.run_id}: its attempts could not be charged now ({exc}); the "
                "preemption sensor charges them at its next tick"
            )
            return {}
        context.log.info(
            f"run {self.run_id}: {money['attempts']} attempt(s) charged, ${money['cost_total_usd']:.6f} in all "
            f"(badput ${money['cost_badput_usd']:.6f}, lost work ${money['cost_lost_work_usd']:.6f}), "
            f"goodput {money['goodput']:.1%}"
        )
        try:
            tracking.log_metrics(self.tracking_uri, self.mlflow_run_id, money)
        except Exception as exc:  # noqa: BLE001 - MLflow down for a moment: the ledger and Dagster have it
            context.log.warning(f"run {self.run_id}: cost not logged to MLflow: {exc}")
        return money


def _reproducibility(attempt, record: dict) -> dg.AssetCheckResult:
    if not attempt.is_reproduction:
        dirty = record["lineage"]["code_dirty"]
        return dg.AssetCheckResult(
            check_name="reproducibility",
            passed=not dirty,
            severity=dg.AssetCheckSeverity.WARN,
            description="not exactly reproducible: the code had uncommitted changes"
            if dirty
            else "reproducible: committed code, pinned snapshot and recorded environment",
            metadata={"code_commit": record["lineage"]["code_commit"], "snapshot_id": record["snapshot_id"]},
        )
    report = compare(attempt.original, record)
    return dg.AssetCheckResult(
        check_name="reproducibility",
        passed=report.passed,
        description=report.summary(),
        metadata={
            "exact": report.exact,
            "weights_equal": report.weights_equal,
            "differences": dg.MetadataValue.json(report.differences),
            "reasons_not_exact": dg.MetadataValue.json(report.reasons_not_exact),
            "original_dagster_run": str(attempt.original.get("dagster_run_id")),
        },
    )


def _preemption_metadata(summary) -> dict:
    figures = summary.metadata()
    return {
        "preemptions": figures["preemptions"],
        "lost_steps": figures["lost_steps"],
        "recovery_seconds_median": figures["recovery_seconds_median"],
        "interruptions": dg.MetadataValue.json(figures["interruptions"]),
    }


def _latest_snapshot_id(context: dg.AssetExecutionContext) -> str:
    """The dataset_snapshot of the run's source: the day its spec names (dataset.as_of), else the newest day."""
    from assets.datasets import resolve_snapshot_id

    dataset = load_run_spec(context.resources.platform.paths(), context.partition_key).dataset
    return resolve_snapshot_id(context.instance, dataset.source, dataset.as_of)
