"""The preemption sensor: follows every launched training run and makes sure preempted runs continue.

Each tick it asks the run's launcher for the job's state, records new preemptions as observations
on the run's `training_run` partition (when, engine, steps lost, seconds to resume), and, where the
job is gone, requests a resume run of the same partition (which restores the newest checkpoint).
Where the engine requeued the job itself (Slurm --requeue, Kueue), it only follows it.
"""

import json

import dagster as dg

from assets.jobs import training_pipeline
from resources.launcher import LauncherResource
from resources.platform import PlatformResource
from training_platform.errors import PlatformError
from training_platform.launch import JobHandle, JobState
from training_platform.paths import PlatformHome
from training_platform.preemption import PreemptionSummary, Recovery, decide, summarize
from training_platform.runlog import RunEvents
from training_platform.runs import load_run_spec

FINAL_STATES = {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value}


def latest_job(events: list[dict]) -> tuple[JobHandle | None, str | None]:
    """The newest submitted job of a run, and how it ended if the orchestrator saw it end."""
    handle, ended = None, None
    for event in events:
        if event["kind"] == "submitted":
            handle, ended = JobHandle(event["backend"], event["job_id"], ""), None
        elif event["kind"] == "job_ended":
            ended = event["state"]
    return handle, ended


def observation(run_id: str, backend: str, interruption) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key="training_run",
        partition=run_id,
        metadata={
            "event": "preemption" if interruption.kind == "preempted" else "killed without notice",
            "engine": backend,
            "at": dg.MetadataValue.timestamp(interruption.at),
            "step_reached": interruption.step_reached,
            "resumed_step": interruption.resumed_step if interruption.resumed_step is not None else -1,
            "lost_steps": interruption.lost_steps if interruption.lost_steps is not None else -1,
            "seconds_to_resume": interruption.recovery_seconds or 0.0,
        },
    )


@dg.sensor(
    name="preemption_sensor",
    minimum_interval_seconds=10,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Records preemptions of training runs and resumes runs whose job is gone.",
    job=training_pipeline,
)
def preemption_sensor(context: dg.SensorEvaluationContext, platform: PlatformResource, launcher: LauncherResource):
    home = platform.paths()
    reported: dict[str, int] = json.loads(context.cursor) if context.cursor else {}
    for run_dir in sorted(p for p in home.runs.iterdir() if p.is_dir()) if home.runs.is_dir() else []:
        run_id = run_dir.name
        events = RunEvents(run_dir).read()
        handle, ended = latest_job(events)
        if handle is None:
            continue
        summary = summarize(events)
        for interruption in summary.interruptions[reported.get(run_id, 0) :]:
            if interruption.recovery_seconds is None:
                break  # report it once the resume figures are known
            context.instance.report_runless_asset_event(observation(run_id, handle.backend, interruption))
            reported[run_id] = reported.get(run_id, 0) + 1
        if ended not in FINAL_STATES:
            yield from _recover(context, home, run_id, handle, launcher, summary)
    context.update_cursor(json.dumps(reported))


def _recover(
    context: dg.SensorEvaluationContext,
    home: PlatformHome,
    run_id: str,
    handle: JobHandle,
    launcher: LauncherResource,
    summary: PreemptionSummary,
):
    try:
        spec = load_run_spec(home, run_id)
        backend = launcher.launcher_for(handle.backend)
        status = backend.status(handle)
    except PlatformError as exc:
        context.log.warning(f"{run_id}: cannot follow job {handle.job_id}: {exc}")
        return
    decision = decide(spec, status, summary, engine_keeps_job=getattr(backend, "keeps_preempted_jobs", False))
    if decision.action in (Recovery.RESUME, Recovery.RESUME_ON_DEMAND):
        capacity = "ondemand" if decision.action == Recovery.RESUME_ON_DEMAND else None
        config = {"ops": {"training_run": {"config": {"capacity": capacity}}}} if capacity else {}
        context.log.info(f"{run_id}: {decision.reason}")
        yield dg.RunRequest(
            run_key=f"{run_id}:resume:{max(summary.preemptions, 1)}:{handle.job_id}",
            partition_key=run_id,
            run_config=config,
            tags={"tp/resume_of": run_id, "tp/reason": decision.reason[:200]},
        )
    elif decision.action == Recovery.GIVE_UP:
        context.log.warning(f"{run_id}: not resumed: {decision.reason}")
