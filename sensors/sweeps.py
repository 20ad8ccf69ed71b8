"""The sweep sensor: every few seconds, each running sweep's next step (tell Optuna, submit new trials).

Each trial is a queued `training_run` partition with its team's and its sweep's tags, so the per-team
and per-sweep limits of the queue hold for trials as for any run. Nothing lives in this process: the
study's storage and the trials' run directories hold the sweep (training_platform/sweeps/driver.py),
so a daemon killed and started again mid-sweep loses no trial and starts none twice (a trial's run key
is its run id). A finished sweep is recorded as a materialization of its `sweep` partition.
"""

import dagster as dg

from assets.jobs import run_asset_keys, training_pipeline
from assets.partitions import training_runs
from resources.platform import PlatformResource
from sensors.run_status import will_retry
from training_platform.launch import JobState, JobStatus
from training_platform.paths import PlatformHome
from training_platform.recovery.preemption import Recovery, decide, summarize
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import load_run_spec, spec_tags
from training_platform.spec.submission import LEFT_JOB_TAG, PARTITION_TAG, SWEEP_TAG
from training_platform.sweeps import QueuedSweep, SweepDriver, SweepQueue, SweepResult
from training_platform.sweeps.driver import RunState, TrialRun
from training_platform.sweeps.parent_run import end_parent_run

SWEEP_ASSET = dg.AssetKey("sweep")


@dg.sensor(
    name="sweep_sensor",
    job=training_pipeline,
    minimum_interval_seconds=5,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Drives running sweeps: tells Optuna how trials ended, submits the next trials as queued "
    "training runs, records a finished sweep's results.",
)
def sweep_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource):
    home = platform.paths()
    queue = SweepQueue(home.root)
    requests: list[dg.RunRequest] = []
    partitions: list[str] = []
    events: list[dg.AssetMaterialization] = []
    running = [q for q in queue.all() if q.state == "RUNNING"]
    for queued in running:
        name = queued.sweep.name
        try:
            with queue.locked(name):  # one step of a sweep at a time, even if an old tick still runs
                step = SweepDriver(queued.sweep, home, queued.parent_mlflow_run_id, queued.trials_until).step(
                    lambda run_id: trial_run_state(context.instance, home, run_id)
                )
        except Exception as exc:  # noqa: BLE001 - one broken sweep must not stop the others
            context.log.error(f"sweep {name}: this step failed ({exc}); the next tick tries again")
            continue
        for outcome in step.told:
            context.log.info(f"sweep {name} trial {outcome.number} ({outcome.run_id}): {outcome.state} "
                             f"value={outcome.value} steps={outcome.steps}")
        for launch in step.launch:
            partitions.append(launch.run_id)
            requests.append(
                dg.RunRequest(
                    run_key=launch.run_id,  # submitted once, however often a step hands it out
                    partition_key=launch.run_id,
                    tags=spec_tags(launch.spec, **{SWEEP_TAG: name, "tp/sweep_trial": str(launch.trial_number)}),
                    asset_selection=run_asset_keys(launch.spec),
                )
            )
        if step.result is not None:
            if _recorded_finished(context.instance, name):
                queue.mark(name, "FINISHED")  # its results are in the catalog: nothing left to do
            else:
                end_parent_run(platform.mlflow_uri(), queued.parent_mlflow_run_id, step.result)
                events.append(finished_materialization(queued, step.result))
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[training_runs.build_add_request(partitions)] if partitions else [],
        asset_events=events,
        skip_reason=None if requests or events else f"{len(running)} running sweep(s), nothing to submit",
    )


def trial_run_state(instance: dg.DagsterInstance, home: PlatformHome, run_id: str) -> RunState:
    """Where a trial's training run is: its newest Dagster run, and, after a preemption, whether it resumes."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={PARTITION_TAG: run_id}), limit=1)
    if not runs:
        return RunState(TrialRun.UNKNOWN)
    run = runs[0]
    if not run.is_finished:
        return RunState(TrialRun.RUNNING)
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return RunState(TrialRun.FINISHED)
    if run.status == dg.DagsterRunStatus.CANCELED:
        return RunState(TrialRun.FAILED, f"Dagster run {run.run_id} was cancelled")
    if LEFT_JOB_TAG in run.tags:
        return RunState(TrialRun.RUNNING)  # its job goes on: the preemption sensor has a run take it over
    spec = load_run_spec(home, run_id)
    events = RunEvents(home.run_dir(run_id)).read()
    ended = [e for e in events if e["kind"] == "job_ended"]
    if ended and ended[-1]["state"] == JobState.PREEMPTED.value:
        decision = decide(spec, JobStatus(JobState.PREEMPTED), summarize(events))
        if decision.action in (Recovery.RESUME, Recovery.RESUME_ON_DEMAND):
            return RunState(TrialRun.RUNNING)  # the preemption sensor resumes it
    elif will_retry(instance, run, spec):
        return RunState(TrialRun.RUNNING)  # the failure sensor retries it
    return RunState(TrialRun.FAILED, f"Dagster run {run.run_id} failed; see it in the UI")


def _recorded_finished(instance: dg.DagsterInstance, name: str) -> bool:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=SWEEP_ASSET, asset_partitions=[name]), limit=1
    ).records
    metadata = records[0].asset_materialization.metadata if records and records[0].asset_materialization else {}
    return "state" in metadata and metadata["state"].value == "FINISHED"


def finished_materialization(queued: QueuedSweep, result: SweepResult) -> dg.AssetMaterialization:
    summary = result.as_dict()
    table = "\n".join(
        ["| trial | run | state | value | steps | cost $ |", "|---|---|---|---|---|---|"]
        + [f"| {t.number} | {t.run_id} | {t.state} | {t.value} | {t.steps} | {t.cost_usd:.4f} |" for t in result.trials]
    )
    window = queued.window
    return dg.AssetMaterialization(
        asset_key=SWEEP_ASSET,
        partition=queued.sweep.name,
        metadata={
            "state": "FINISHED",
            "team": queued.sweep.team,
            "trials": summary["trials"],
            "pruned": summary["pruned"],
            "failed": summary["fail"],
            "total_steps": summary["total_steps"],
            "total_cost_usd": summary["total_cost_usd"],
            "best_value": summary["best_value"],
            "best_run_id": summary["best_run_id"] or "",
            "best_params": dg.MetadataValue.json(summary["best_params"] or {}),
            "trial_table": dg.MetadataValue.md(table),
            "window_start": window.get("start"),
            "window_saving_vs_now_usd": window.get("saving"),
            "parent_mlflow_run_id": summary["parent_mlflow_run_id"] or "",
            "summary": dg.MetadataValue.json(summary),  # what `tp sweep --json` prints
        },
    )
