"""The preemption sensor: follows every launched training run and makes sure preempted runs continue.

It also charges attempts that closed without the training asset settling them (cost/charges.py).

Each tick it asks the run's launcher for the job's state, records new interruptions (preemptions, kills
without notice, lost nodes, time limits) as observations on the run's `training_run` partition (when,
engine, steps lost, seconds to resume), and, where the
job is gone, requests a resume run of the same partition (which restores the newest checkpoint).
Where the engine requeued the job itself (Slurm --requeue, Kueue), it only follows it.

A job whose Dagster run went down while it went on (the run's process killed, or failed on an error of its own)
is taken over by a new run of the partition, which follows it to its end and materializes the run if it
succeeded (launch/following.py). A run Dagster still shows in progress whose process is gone is marked failed first.
"""

import json
import time
from datetime import UTC, datetime

import dagster as dg

from assets.jobs import run_asset_keys, training_pipeline
from resources.launcher import LauncherResource, follower_gone
from resources.platform import PlatformResource
from training_platform.cost.attempts import attempt_spans
from training_platform.cost.backends import open_ledger
from training_platform.cost.charges import attempt_key, settle_spans
from training_platform.errors import PlatformError
from training_platform.launch import JobState, JobStatus
from training_platform.launch.base import gone_after_preemption, keeps_preempted_jobs
from training_platform.launch.following import FollowedJob, newest_job
from training_platform.paths import PlatformHome
from training_platform.recovery.preemption import (
    PreemptionSummary,
    Recovery,
    deadline_risk,
    decide,
    progress_of,
    summarize,
)
from training_platform.recovery.requeue import follow_requeued
from training_platform.runs.events import NODE_FAILURE, TIME_LIMIT, RunEvents
from training_platform.runs.specs import load_run_spec
from training_platform.spec.submission import FOLLOW_TAG, LEFT_JOB_TAG, PARTITION_TAG, RESUME_TAG
from training_platform.sweeps.trial import TrialContext

FINAL_STATES = {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value}
IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
EVENT_LABELS = {  # an interruption's kind (preemption.Interruption) as its observation names it
    "preempted": "preemption",
    "killed": "killed without notice",
    NODE_FAILURE: "node failure",
    TIME_LIMIT: "time limit",
}


def observation(run_id: str, backend: str, interruption) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key="training_run",
        partition=run_id,
        metadata={
            "event": EVENT_LABELS.get(interruption.kind, interruption.kind),
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
    charged = open_ledger(home.root).keys()
    for run_dir in sorted(p for p in home.runs.iterdir() if p.is_dir()) if home.runs.is_dir() else []:
        run_id = run_dir.name
        events = RunEvents(run_dir).read()
        _charge(context, home, run_id, events, charged)
        job = newest_job(run_id, events)
        if job is None:
            continue
        summary = summarize(events)
        for interruption in summary.interruptions[reported.get(run_id, 0) :]:
            if interruption.recovery_seconds is None:
                break  # report it once the resume figures are known
            context.instance.report_runless_asset_event(observation(run_id, job.handle.backend, interruption))
            reported[run_id] = reported.get(run_id, 0) + 1
        if job.ended not in FINAL_STATES:
            yield from _recover(context, home, run_id, job, launcher, summary)
    context.update_cursor(json.dumps(reported))


def _charge(
    context: dg.SensorEvaluationContext, home: PlatformHome, run_id: str, events: list[dict], charged: set[str]
) -> None:
    """Charge attempts closed but not charged: requeues within one job, or an asset process that went down
    before it settled (the training asset settles after every launch; the ledger keeps each charge once)."""
    spans = attempt_spans(events)
    if all(attempt_key(run_id, s.number) in charged for s in spans if s.closed):
        return
    try:
        trial = TrialContext.read(home, run_id)
        settle_spans(home.root, run_id, spans, load_run_spec(home, run_id), trial.sweep if trial else None)
    except (PlatformError, OSError) as exc:
        context.log.warning(f"{run_id}: its attempts could not be charged this tick: {exc}")


def _recover(
    context: dg.SensorEvaluationContext,
    home: PlatformHome,
    run_id: str,
    job: FollowedJob,
    launcher: LauncherResource,
    summary: PreemptionSummary,
):
    handle = job.handle
    try:
        spec = load_run_spec(home, run_id)
        backend = launcher.launcher_for(handle.backend)
        status = backend.status(handle)
    except PlatformError as exc:
        context.log.warning(f"{run_id}: cannot follow job {handle.job_id}: {exc}")
        return
    run_dir = home.run_dir(run_id)
    risk = deadline_risk(spec, progress_of(run_dir, RunEvents(run_dir).read(), time.time()), summary, datetime.now(UTC))
    decision = decide(spec, status, summary, keeps_preempted_jobs(backend), risk)
    if decision.action == Recovery.FOLLOW:
        try:
            done = follow_requeued(backend, handle, spec, run_dir, status)
        except PlatformError as exc:
            context.log.warning(f"{run_id}: requeued job {handle.job_id} not moved yet: {exc}")
            done = []
        for what in done:
            context.log.warning(f"{run_id}: {what}")
    if decision.action in (Recovery.RESUME, Recovery.RESUME_ON_DEMAND):
        capacity = "ondemand" if decision.action == Recovery.RESUME_ON_DEMAND else None
        config = {"ops": {"training_run": {"config": {"capacity": capacity}}}} if capacity else {}
        context.log.info(f"{run_id}: {decision.reason}")
        yield dg.RunRequest(
            run_key=f"{run_id}:resume:{max(summary.preemptions, 1)}:{handle.job_id}",
            partition_key=run_id,
            run_config=config,
            tags={RESUME_TAG: job.submitted_by, "tp/reason": decision.reason[:200]},
            asset_selection=run_asset_keys(spec),
        )
    elif decision.action == Recovery.GIVE_UP:
        context.log.warning(f"{run_id}: not resumed: {decision.reason}")
    # A preempted job that is gone was resumed above instead.
    if job.left_behind and not gone_after_preemption(backend, status) and follower_gone(context.instance, job):
        yield from _take_over(context, run_id, job, status, spec)


def _take_over(context: dg.SensorEvaluationContext, run_id: str, job: FollowedJob, status: JobStatus, spec):
    """A run of the partition to follow the job its Dagster run stopped following, unless one is on its way."""
    instance = context.instance
    followed_by = instance.get_run_by_id(job.followed_by) if job.followed_by else None
    if followed_by is not None and LEFT_JOB_TAG not in followed_by.tags:
        instance.add_run_tags(followed_by.run_id, {LEFT_JOB_TAG: job.handle.job_id})  # before it shows failed
    if followed_by is not None and not followed_by.is_finished:
        instance.report_run_failed(
            followed_by,
            f"the process of this run (pid {job.follower.pid if job.follower else '?'}) is gone; its "
            f"{job.handle.backend} job {job.handle.job_id} goes on, and a new run of partition {run_id} follows it",
        )
    if instance.get_runs(dg.RunsFilter(tags={PARTITION_TAG: run_id}, statuses=IN_PROGRESS), limit=1):
        return  # that run (a resume, a retry, a user's) takes the job over itself (LauncherResource)
    reason = f"Dagster run {job.followed_by} stopped following {job.handle.job_id}, which is {status.state.value}"
    context.log.warning(f"{run_id}: {reason}: a new run takes it over")
    yield dg.RunRequest(
        run_key=f"{run_id}:follow:{job.handle.job_id}:{job.followed_by}",
        partition_key=run_id,
        tags={FOLLOW_TAG: job.followed_by, "tp/reason": reason[:200]},
        asset_selection=run_asset_keys(spec),
    )
