"""One front door for every backend: the `training_run` asset is the same code whatever runs it.

The resource opens a Dagster Pipes session whose messages travel through a file in the run
directory (visible to the job on a local disk or a shared filesystem), submits the plan with
the chosen launcher, and follows the job until it finishes. Terminating the Dagster run (the UI's
Terminate button, `tp cancel`) interrupts the wait, and the job is cancelled with it: the local
process group, the Slurm job, the Kubernetes Job; the checkpoints it saved stay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import dagster as dg
from pydantic import Field

from resources.live_run import LiveRun
from resources.pipes_reader import PipesJsonLinesReader
from training_platform.errors import LaunchError, PlatformError
from training_platform.launch import JobHandle, JobState, JobStatus, Launcher, RunRequest
from training_platform.launch.base import gone_after_preemption, keeps_preempted_jobs, run_files_store
from training_platform.launch.following import FOLLOWED, JOB_ENDED, SUBMITTED, FollowedJob, Follower, newest_job
from training_platform.launch.registry import launcher_for
from training_platform.recovery.requeue import follow_requeued
from training_platform.runs.events import NODE_FAILURE, RunEvents
from training_platform.runs.remote_files import ATTEMPT_ENV, PIPES_MESSAGES_FILE, RunFilesPuller
from training_platform.spec.submission import LEFT_JOB_TAG

CANCEL_WAIT_S = 30.0
STATUS_OUTAGE_S = 120.0  # how long the backend may fail to report the job's state before the run fails
# What Dagster raises in a run it terminates (the UI's Terminate button, `tp cancel`): the job goes too.
# Any other error leaves the job alone: the preemption sensor has a new run take over a job whose run stopped
# following it (launch/following.py).
TERMINATED = (dg.DagsterExecutionInterruptedError, KeyboardInterrupt)


@dataclass
class LaunchOutcome:
    status: JobStatus
    job_id: str
    pipes_results: list
    logs_tail: str


class LauncherResource(dg.ConfigurableResource):
    """Launches training runs: `local` (torchrun), `slurm` (sbatch + srun) or `k8s` (Job + Kueue)."""

    mode: str = Field("local", description="backend used when a spec names none: local, slurm or k8s")
    poll_seconds: float = Field(1.0, gt=0, description="how often the job's status is polled")
    slurm_conf: str | None = Field(None, description="slurm.conf for the Slurm client commands; default: SLURM_CONF")
    k8s_approved_images: list[str] = Field(
        default_factory=list, description="registries/images the Kubernetes launcher may run; default: built-in list"
    )

    def launcher_for(self, backend: str) -> Launcher:
        return launcher_for(backend, slurm_conf=self.slurm_conf, k8s_images=self.k8s_approved_images or None)

    def job_to_take_over(
        self, context: dg.AssetExecutionContext, run_dir: Path, run_id: str, report_ended: bool = False
    ) -> FollowedJob | None:
        """The run's job whose Dagster run is gone, for this run to follow instead of launching the run again: one
        still queued or running, one that succeeded (its result is collected, not trained again) and, when
        `report_ended`, one that ended otherwise (this run reports its end). A job that ended otherwise is recorded
        as ended, and the run launches a new one (which resumes from the newest checkpoint).

        Refused (LaunchError) while the Dagster run following the job is still there: two runs would follow it."""
        events = RunEvents(run_dir)
        job = newest_job(run_id, events.read())
        if job is None or not job.unfollowed:
            return None
        # This run's own job, when its run worker was restarted (Dagster's run monitoring may resume a run).
        if job.followed_by != context.run_id and not follower_gone(context.instance, job):
            raise LaunchError(
                f"run {run_id}: its {job.handle.backend} job {job.handle.job_id} is followed by Dagster run "
                f"{job.followed_by}, which is still in progress; wait for it, or terminate it (`tp cancel`) to stop "
                "the job as well"
            )
        launcher = self.launcher_for(job.handle.backend)
        status = launcher.status(job.handle)
        gone = gone_after_preemption(launcher, status)
        live = not status.state.finished and not gone
        if live or status.state == JobState.SUCCEEDED or (report_ended and not gone):
            context.log.warning(
                f"run {run_id}: Dagster run {job.followed_by} stopped following {job.handle.backend} job "
                f"{job.handle.job_id}, which is {status.state.value}: this run takes it over"
            )
            return job
        events.append(
            JOB_ENDED,
            state=status.state.value,
            reason=f"{status.reason} (seen after Dagster run {job.followed_by} had stopped following it)",
        )
        return None

    def run(
        self,
        context: dg.AssetExecutionContext,
        request: RunRequest,
        backend: str | None = None,
        take_over: FollowedJob | None = None,
    ) -> LaunchOutcome:
        """Launch the run and follow its job to its end; or, given `take_over` (job_to_take_over), follow that job."""
        chosen = take_over.handle.backend if take_over else backend or request.spec.backend or self.mode
        launcher = self.launcher_for(chosen)
        messages = request.run_dir / PIPES_MESSAGES_FILE
        if take_over is None:
            request.write_spec()
        store = run_files_store(launcher)
        # A job taken over already wrote messages of its Pipes session: they are read from the start.
        reader = PipesJsonLinesReader(messages, keep_existing=take_over is not None)
        with dg.open_pipes_session(
            context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader
        ) as session:
            if take_over is None:
                # A job handing its files over through the store tags them with this Dagster run (runs/remote_files.py).
                attempt = {ATTEMPT_ENV: context.run_id} if store is not None else {}
                request = replace(request, env={**request.env, **session.get_bootstrap_env_vars(), **attempt})
                plan = launcher.plan(request)
                context.log.info(f"launch plan:\n{plan.render()}")
                handle, submitted_by = launcher.submit(plan), context.run_id
            else:
                handle, submitted_by = take_over.handle, take_over.submitted_by
            events = RunEvents(request.run_dir)
            pull = RunFilesPuller(store, request.run_id, request.run_dir, submitted_by)
            follower = Follower.this_process().fields()
            try:  # from here on, a terminated run takes its job with it
                if take_over is None:
                    # The capacity it runs on prices its attempts (cost/charges.py); a resume may move to on-demand.
                    events.append(
                        SUBMITTED,
                        backend=handle.backend,
                        job_id=handle.job_id,
                        dagster_run_id=context.run_id,
                        spot=request.spec.resources.spot,
                        mlflow_run_id=request.env.get("MLFLOW_RUN_ID"),
                        **follower,
                    )
                    context.log.info(f"submitted {handle.backend} job {handle.job_id}")
                else:
                    events.append(
                        FOLLOWED,
                        backend=handle.backend,
                        job_id=handle.job_id,
                        dagster_run_id=context.run_id,
                        **follower,
                    )
                    context.log.info(f"following {handle.backend} job {handle.job_id}, submitted by {submitted_by}")
                live = LiveRun(context, launcher, handle, request.run_dir, request.spec.training.max_steps)
                status = self._wait(context, launcher, handle, live, request, events, pull, take_over is not None)
                pull(final=True)  # what the job pushed as it ended: its result, its last events and messages
                live.poll(final=True)
            except TERMINATED:
                self._cancel(context, launcher, handle, events)
                raise
            except BaseException:
                # The job goes on without this run: the preemption sensor has a new run take it over.
                context.instance.add_run_tags(context.run_id, {LEFT_JOB_TAG: handle.job_id})
                raise
            events.append(JOB_ENDED, state=status.state.value, reason=status.reason)
        logs = launcher.logs(handle)
        return LaunchOutcome(status, handle.job_id, list(session.get_results()), logs[-4000:])

    def _wait(
        self,
        context: dg.AssetExecutionContext,
        launcher: Launcher,
        handle: JobHandle,
        live: LiveRun,
        request: RunRequest,
        events: RunEvents,
        pull: RunFilesPuller,
        taken_over: bool = False,
    ) -> JobStatus:
        """Poll until the job ends or is preempted; a backend that does not answer for a while is asked again.

        A job the engine keeps through a preemption (Kueue suspends an evicted Job and admits it again) is waited
        for until it ends, as a requeued Slurm job is: the partition materializes when the job finishes.

        Each time the job starts running (first, and again after a requeue) is recorded: an attempt is charged
        from when its job held its allocation, not from when it was queued (cost/attempts.py). A requeued job
        is moved to on-demand when due and released from the engine's hold (requeue.py). A job `taken_over` from
        another Dagster run has started already: it is recorded again only when it restarts."""
        failures, running, ran = 0, taken_over, taken_over
        lost: tuple[str, ...] = ()
        kept = keeps_preempted_jobs(launcher)
        while True:
            try:
                status = launcher.status(handle)
                failures = 0
                if status.state == JobState.RUNNING and not running:
                    events.append("job_running", again=ran)
                if status.lost_nodes and status.lost_nodes != lost:
                    context.log.warning(f"job {handle.job_id}: {status.reason}")
                    events.append(NODE_FAILURE, job_id=handle.job_id, nodes=list(status.lost_nodes))
                lost = status.lost_nodes
                running = status.state == JobState.RUNNING
                ran = ran or running
            except PlatformError as exc:  # squeue or the API server busy for a moment: the job goes on
                failures += 1
                if failures * self.poll_seconds > STATUS_OUTAGE_S:
                    raise
                context.log.warning(f"could not read the state of job {handle.job_id} ({exc}); asking again")
            else:
                if status.state.finished or (status.state == JobState.PREEMPTED and not kept):
                    return status
                self._follow_requeued(context, launcher, handle, request, status)
            launcher.wait(handle, self.poll_seconds)
            pull()
            live.poll()

    @staticmethod
    def _follow_requeued(
        context: dg.AssetExecutionContext, launcher: Launcher, handle: JobHandle, request: RunRequest, status: JobStatus
    ) -> None:
        try:
            done = follow_requeued(launcher, handle, request.spec, request.run_dir, status)
        except PlatformError as exc:  # the job is between states; the next poll asks again
            context.log.debug(f"requeued job {handle.job_id} not moved yet: {exc}")
            return
        for what in done:
            context.log.warning(what)

    def _cancel(self, context: dg.AssetExecutionContext, launcher: Launcher, handle: JobHandle, events) -> None:
        """The Dagster run was terminated (or its process is going down): the job goes with it."""
        context.log.warning(f"the run was terminated: cancelling {handle.backend} job {handle.job_id}")
        # Recorded first: a cancelled job's ranks exit as if preempted, and the preemption sensor must not
        # take them for a preemption to resume while the cancel is under way.
        events.append(JOB_ENDED, state=JobState.CANCELLED.value, reason="cancelled: the Dagster run was terminated")
        launcher.cancel(handle)
        deadline = time.monotonic() + CANCEL_WAIT_S
        status = launcher.status(handle)
        while not status.state.finished and status.state != JobState.PREEMPTED and time.monotonic() < deadline:
            time.sleep(0.2)
            status = launcher.status(handle)
        context.log.warning(f"{handle.backend} job {handle.job_id} ended {status.state.value}; its checkpoints stay")


def follower_gone(instance: dg.DagsterInstance, job: FollowedJob) -> bool:
    """Whether the Dagster run following the job has stopped: it finished (failed, for instance, with the job still
    running), or its process is gone while Dagster still shows it in progress (a run's process that was killed
    cannot say so; on this host its pid tells)."""
    run = instance.get_run_by_id(job.followed_by) if job.followed_by else None
    if run is None or run.is_finished:
        return True
    return job.follower is not None and job.follower.is_gone() is True
