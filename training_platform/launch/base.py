"""The Launcher protocol shared by every backend (local torchrun, Slurm, Kubernetes).

Deciding what to run (``plan``) is kept apart from running it (``submit``): a plan can be
printed, tested and diffed without touching a cluster.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from training_platform.runs.layout import RESULT_FILE
from training_platform.spec import TrainSpec


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# The worker exits with this code after an emergency checkpoint, so launchers can tell a
# preemption from a failure (EX_TEMPFAIL: "try again later").
PREEMPTED_EXIT_CODE = 75
# ...and leaves runs/layout.py's PREEMPTED_MARKER in its run directory, since torchrun/srun replace exit codes with
# their own.
# torchrun with its flags, forking pre-imported workers (see launch/agent.py): every backend runs it.
AGENT_MODULE = "training_platform.launch.agent"
# CPU threads per rank, where a launcher knows better than the worker's guess (its node's cores / its local ranks).
THREADS_PER_RANK_ENV = "TP_THREADS_PER_RANK"


@dataclass(frozen=True)
class RunRequest:
    """One run of a spec: the resolved spec plus where its files and tracking go."""

    spec: TrainSpec
    run_id: str
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def spec_path(self) -> Path:
        return self.spec_file(self.run_dir)

    @staticmethod
    def spec_file(run_dir: Path) -> Path:
        """Where a run's launched spec is: what its newest job trains."""
        return run_dir / "spec.json"

    def write_spec(self) -> Path:
        """Write the resolved spec for a new attempt; a result left by an earlier one is removed."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / RESULT_FILE).unlink(missing_ok=True)
        self.spec_path.write_text(self.spec.model_dump_json(indent=2))
        return self.spec_path

    def worker_args(self) -> list[str]:
        """The worker's own arguments, after `python -m` / torchrun's module flag."""
        return ["training_platform.train", str(self.spec_path), "--run-id", self.run_id]


@dataclass(frozen=True)
class LaunchPlan:
    """What will run, where, with which resources: printable without submitting."""

    backend: str
    run_id: str
    command: list[str]
    env: dict[str, str]
    workdir: Path
    resources: dict[str, object]
    files: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"backend: {self.backend}", f"run: {self.run_id}", f"workdir: {self.workdir}"]
        lines += [f"resources: {', '.join(f'{k}={v}' for k, v in self.resources.items())}"]
        lines += ["command: " + " ".join(self.command)]
        for name, text in self.files.items():
            lines += [f"--- {name}", text.rstrip()]
        # Printed by `tp render` and logged by the training asset: never a secret of this process's.
        from training_platform.redaction import redact

        return redact("\n".join(lines))


@dataclass(frozen=True)
class JobHandle:
    backend: str
    job_id: str
    run_id: str


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    reason: str = ""
    exit_code: int | None = None
    preemptions: int = 0
    restarts: int = 0
    # Nodes of the job that stopped answering (a running job), or whose failure ended its last attempt.
    lost_nodes: tuple[str, ...] = ()


class Launcher(Protocol):
    name: str

    def plan(self, request: RunRequest) -> LaunchPlan: ...

    def submit(self, plan: LaunchPlan) -> JobHandle: ...

    def status(self, handle: JobHandle) -> JobStatus: ...

    def cancel(self, handle: JobHandle) -> None: ...

    def logs(self, handle: JobHandle) -> str: ...

    def wait(self, handle: JobHandle, timeout: float) -> None:
        """Return when the job may have changed state (its process ended, where the launcher can see that), or
        after TIMEOUT seconds: the pause between two status polls."""
        ...

    def move_to_on_demand(self, handle: JobHandle, spec: TrainSpec) -> str | None:
        """Move a spot job the engine keeps (requeued, evicted) to on-demand capacity before it runs again;
        what was done, or None where the backend cannot (a job that is gone is resubmitted instead)."""
        ...

    def release_requeue_hold(self, handle: JobHandle) -> str | None:
        """Let a requeued job whose last attempt checkpointed cleanly start at once; what was done, or None."""
        ...


def gone_after_preemption(launcher: Launcher, status: JobStatus) -> bool:
    """A preempted job the engine does not keep: a new job resumes the run (the preemption sensor submits it)."""
    return status.state == JobState.PREEMPTED and not keeps_preempted_jobs(launcher)


def keeps_preempted_jobs(launcher: Launcher) -> bool:
    """Whether the engine keeps a preempted job and runs it again itself (Kueue requeues an evicted Job): then the
    platform follows the job instead of resubmitting it. A launcher says so with `keeps_preempted_jobs = True`."""
    return getattr(launcher, "keeps_preempted_jobs", False)


def run_files_store(launcher: Launcher):
    """Where the launcher's jobs push their run's files, when they share no disk with the Dagster side (pods with
    no shared home): the Dagster side pulls them into its run directory (runs/remote_files.py). None: a shared disk."""
    return getattr(launcher, "run_store", None)


def python_executable() -> str:
    return sys.executable
