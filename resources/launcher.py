"""One front door for every backend: the `training_run` asset is the same code whatever runs it.

The resource opens a Dagster Pipes session whose messages travel through a file in the run
directory (visible to the job on a local disk or a shared filesystem), submits the plan with
the chosen launcher, and follows the job until it finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import dagster as dg
from pydantic import Field

from resources.pipes_reader import PipesJsonLinesReader
from training_platform.launch import JobState, JobStatus, Launcher, RunRequest
from training_platform.launch.registry import launcher_for
from training_platform.runlog import RunEvents


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

    def run(self, context: dg.AssetExecutionContext, request: RunRequest, backend: str | None = None) -> LaunchOutcome:
        launcher = self.launcher_for(backend or request.spec.backend or self.mode)
        messages = request.run_dir / "pipes-messages.jsonl"
        request.write_spec()
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesEnvContextInjector(),
            message_reader=PipesJsonLinesReader(messages),
        ) as session:
            request = replace(request, env={**request.env, **session.get_bootstrap_env_vars()})
            plan = launcher.plan(request)
            context.log.info(f"launch plan:\n{plan.render()}")
            handle = launcher.submit(plan)
            events = RunEvents(request.run_dir)
            events.append("submitted", backend=handle.backend, job_id=handle.job_id, dagster_run_id=context.run_id)
            context.log.info(f"submitted {handle.backend} job {handle.job_id}")
            status = launcher.status(handle)
            while not status.state.finished and status.state != JobState.PREEMPTED:
                time.sleep(self.poll_seconds)
                status = launcher.status(handle)
            events.append("job_ended", state=status.state.value, reason=status.reason)
        logs = launcher.logs(handle)
        return LaunchOutcome(status, handle.job_id, list(session.get_results()), logs[-4000:])
