"""Local launcher: torchrun on this machine (gloo on CPU, nccl when GPUs are present).

A run of several nodes runs one agent per "node" of TP_LOCAL_NODES, network namespaces of this machine
(deploy/nodes/local-nodes.sh; node_group.py), so its rendezvous and collectives cross a real interface.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from pathlib import Path

from training_platform.errors import LaunchError, SpecError
from training_platform.launch import rendezvous, standby
from training_platform.launch.base import (
    AGENT_MODULE,
    PREEMPTED_EXIT_CODE,
    THREADS_PER_RANK_ENV,
    JobHandle,
    JobState,
    JobStatus,
    LaunchPlan,
    RunRequest,
    python_executable,
)
from training_platform.launch.failures import last_exception
from training_platform.launch.frameworks import preload_environment
from training_platform.launch.job_env import job_environment
from training_platform.launch.node_group import Node
from training_platform.paths import PlatformHome
from training_platform.runs.layout import PREEMPTED_MARKER, RESULT_FILE
from training_platform.spec import TrainSpec

EXIT_CODE_FILE = "exit_code"
LOG_FILE = "worker.log"
# A cancelled job's ranks get this long to write their emergency checkpoint before SIGKILL.
CANCEL_GRACE_S = 8.0
KILL_WAIT_S = 10.0
NODES_ENV = "TP_LOCAL_NODES"
# The interface deploy/nodes/local-nodes.sh gives every node: the address gloo's pairs use.
NODE_INTERFACE = "tp0"
NODE_GROUP_MODULE = "training_platform.launch.node_group"


def local_nodes(text: str | None = None) -> list[Node]:
    """The nodes of TP_LOCAL_NODES (`NS=ADDR,NS=ADDR`), the first of which hosts a run's rendezvous."""
    text = os.environ.get(NODES_ENV, "") if text is None else text
    try:
        return [Node.parse(part.strip(), NODES_ENV) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise SpecError(f"{exc}; deploy/nodes/local-nodes.sh env prints the line to export") from None


class LocalLauncher:
    """Runs the worker under `torchrun --standalone` with one process per requested slot."""

    name = "local"

    def __init__(self, visible_gpus: int | None = None, nodes: list[Node] | None = None):
        if visible_gpus is not None:
            self.visible_gpus = visible_gpus
        self._nodes = nodes  # else TP_LOCAL_NODES, read when a run asks for several nodes
        self._procs: dict[str, subprocess.Popen] = {}

    @functools.cached_property
    def visible_gpus(self) -> int:
        """This machine's GPUs, counted when a run asks for one: counting imports torch, over a second of every
        `tp train`'s start, where a CPU run needs no count."""
        return _count_gpus()

    def nodes(self) -> list[Node]:
        return local_nodes() if self._nodes is None else self._nodes

    def check(self, plan: LaunchPlan) -> None:
        """Refuse a plan this machine cannot run (the Launcher protocol's pre-submission check)."""
        self._check(plan.resources["nodes"], plan.resources["gpus_per_node"])

    def _check(self, nodes: int, gpus_per_node: int) -> None:
        if nodes > 1 and nodes > len(self.nodes()):
            raise SpecError(
                f"resources.nodes: {nodes} nodes requested, but the local launcher knows {len(self.nodes())} "
                f"({NODES_ENV}); set nodes: 1, use --launcher slurm|k8s, or start nodes on this machine: "
                f"deploy/nodes/local-nodes.sh up {nodes}, then export the line it prints"
            )
        if nodes > 1 and gpus_per_node:
            raise SpecError(
                "resources.gpus_per_node: the local launcher's nodes share this machine's GPUs; "
                "set gpus_per_node: 0 for a multi-node run here, or use --launcher slurm|k8s"
            )
        if gpus_per_node and gpus_per_node > self.visible_gpus:
            raise SpecError(
                f"resources.gpus_per_node: {gpus_per_node} GPU(s) requested but this machine has "
                f"{self.visible_gpus}; set gpus_per_node: 0 to train on CPU, or use a GPU machine"
            )

    def plan(self, request: RunRequest) -> LaunchPlan:
        self._check(request.spec.resources.nodes, request.spec.resources.gpus_per_node)
        nproc = request.spec.resources.procs_per_node
        env = dict(request.env)
        if request.spec.resources.nodes > 1:
            return self._plan_nodes(request, env)
        if os.environ.get(standby.SHARED_OWNER_ENV, "").isdigit():
            # A `tp server`'s run: every attempt, a spot run's requeues included, starts from the shared standby
            # once that is up. A standby of the run's own would load the same imports again (~7 s of a core).
            env[standby.SHARED_ENV] = "1"
        elif request.spec.resources.spot:
            # Spot runs expect preemptions: their requeues start from a warm standby (standby.py).
            env[standby.STANDBY_ENV] = "1"
        if standby.SHARED_ENV in env or standby.STANDBY_ENV in env:
            env |= preload_environment(request.spec)  # its standby loads them too, before it forks the ranks
        command = [
            python_executable(),
            "-m",
            AGENT_MODULE,
            # What torchrun's --standalone picks (a rendezvous store this agent hosts on a free port),
            # listening on loopback alone: the store unpickles what it reads (rendezvous.py).
            f"--rdzv-backend={rendezvous.LOOPBACK}",
            "--rdzv-endpoint=127.0.0.1:0",
            "--local-addr=127.0.0.1",
            f"--rdzv-id={request.run_id}",
            f"--nproc-per-node={nproc}",
            # A rank that dies restarts the whole group, which resumes from the newest checkpoint.
            f"--max-restarts={request.spec.preemption.max_restarts}",
            "-m",
            *request.worker_args(),
        ]
        return LaunchPlan(
            backend=self.name,
            run_id=request.run_id,
            command=command,
            env=env,
            workdir=request.run_dir,
            resources={"nodes": 1, "procs_per_node": nproc, "gpus_per_node": request.spec.resources.gpus_per_node},
        )

    def _plan_nodes(self, request: RunRequest, env: dict[str, str]) -> LaunchPlan:
        """One agent per node (node_group.py); no warm standby: its workers could not join another namespace."""
        spec = request.spec
        nodes = self.nodes()[: spec.resources.nodes]
        env.setdefault("GLOO_SOCKET_IFNAME", NODE_INTERFACE)
        # The nodes share this machine's cores: a worker would give its node's ranks every core of it. Two ranks
        # with two threads each on two cores trained 5x slower (OpenMP's threads spin while they wait).
        ranks = spec.resources.nodes * spec.resources.procs_per_node
        env.setdefault(THREADS_PER_RANK_ENV, str(max(1, (os.cpu_count() or 1) // ranks)))
        agent = [
            python_executable(),
            "-m",
            AGENT_MODULE,
            f"--rdzv-id={request.run_id}",
            f"--nproc-per-node={spec.resources.procs_per_node}",
            f"--max-restarts={spec.preemption.max_restarts}",
            "-m",
            *request.worker_args(),
        ]
        return LaunchPlan(
            backend=self.name,
            run_id=request.run_id,
            command=[python_executable(), "-m", NODE_GROUP_MODULE, *(f"--node={n}" for n in nodes), "--", *agent],
            env=env,
            workdir=request.run_dir,
            resources={"nodes": len(nodes), "procs_per_node": spec.resources.procs_per_node, "gpus_per_node": 0},
        )

    def submit(self, plan: LaunchPlan) -> JobHandle:
        plan.workdir.mkdir(parents=True, exist_ok=True)
        for stale in (EXIT_CODE_FILE, PREEMPTED_MARKER, RESULT_FILE, standby.STOP_FILE):
            (plan.workdir / stale).unlink(missing_ok=True)
        log = open(plan.workdir / LOG_FILE, "ab")  # noqa: SIM115 - handed to the child process
        # A shell records the exit code so status() works from any process, not only this one.
        # It forwards SIGTERM to torchrun and keeps waiting, so a preempted worker's emergency
        # checkpoint and exit are observed instead of the shell's own death. Once torchrun is gone it
        # kills what is left of the job's process group, itself last: a torchrun that was killed (the
        # OOM killer's pick) leaves its fork server and ranks behind, which would train on into a run
        # already reported FAILED.
        script = (
            '"$@" & child=$!; trap \'kill -TERM "$child" 2>/dev/null\' TERM INT; '
            'while :; do wait "$child"; code=$?; kill -0 "$child" 2>/dev/null || break; done; '
            f'echo "$code" > {EXIT_CODE_FILE}; trap "" TERM INT; kill -KILL 0'
        )
        env = {**job_environment(), **plan.env}  # not the orchestrator's secrets
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", script, "sh", *plan.command],
                cwd=plan.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"could not start torchrun: {exc}; check the Python environment") from exc
        finally:
            log.close()
        self._procs[str(proc.pid)] = proc
        if standby.STANDBY_ENV in plan.env:
            (plan.workdir / standby.JOB_PID_FILE).write_text(str(proc.pid))
            if not standby.running(plan.workdir, env):
                standby.spawn(plan.workdir, proc.pid, env)
        if standby.SHARED_ENV in plan.env and not standby.bound(standby.shared_address(env)):
            owner = int(os.environ[standby.SHARED_OWNER_ENV])
            # For the runs after this one; its log goes to the home of the runs it serves.
            standby.spawn_shared(PlatformHome.from_env(env).root, owner, env)
        return JobHandle(backend=self.name, job_id=f"{proc.pid}:{plan.workdir}", run_id=plan.run_id)

    def status(self, handle: JobHandle) -> JobStatus:
        pid, workdir = _parse(handle)
        proc = self._procs.get(str(pid))
        running = proc.poll() is None if proc else _alive(pid)
        if running:
            return JobStatus(JobState.RUNNING)
        exit_file = workdir / EXIT_CODE_FILE
        if not exit_file.is_file():
            return JobStatus(JobState.CANCELLED, reason="the launcher process was terminated")
        if _group_alive(pid) and time.time() - exit_file.stat().st_mtime < KILL_WAIT_S:
            # The job's shell SIGKILLs its group as it ends; a process of it still inside a system call (a writer's
            # rename that publishes a checkpoint, slow under a busy disk's journal) has yet to leave. The job ends
            # once it is gone, so a run reported failed gains no checkpoint afterwards.
            return JobStatus(JobState.RUNNING)
        code = int(exit_file.read_text().strip() or 1)
        if code == 0:
            return JobStatus(JobState.SUCCEEDED, exit_code=0)
        # torchrun reports its own exit status, so the worker also leaves a marker file.
        if code == PREEMPTED_EXIT_CODE or (workdir / PREEMPTED_MARKER).is_file():
            return JobStatus(JobState.PREEMPTED, "worker wrote an emergency checkpoint and exited", code)
        if (workdir / RESULT_FILE).is_file():
            # The workers finished, then a SIGTERM (a preemption, a cancel) reached torchrun as it exited.
            return JobStatus(JobState.SUCCEEDED, f"the run finished; torchrun was then signalled (exit {code})", code)
        log = workdir / LOG_FILE
        cause = last_exception(log.read_text(errors="replace")) if log.is_file() else None
        where = f"torchrun exited with code {code}; see {log}"
        return JobStatus(JobState.FAILED, f"{cause} ({where})" if cause else where, code)

    def move_to_on_demand(self, handle: JobHandle, spec: TrainSpec) -> str | None:
        """Nothing to move: a preempted local job is gone, and its resume is submitted on on-demand."""
        return None

    def release_requeue_hold(self, handle: JobHandle) -> str | None:
        """Nothing holds a local job: its resume is a new submission."""
        return None

    def cancel(self, handle: JobHandle, grace_s: float = CANCEL_GRACE_S) -> None:
        """SIGTERM to the job's process group (the ranks write an emergency checkpoint and exit), SIGKILL to
        whatever is left after `grace_s`; returns once no process of the group is left (or KILL_WAIT_S after the
        SIGKILL)."""
        pid, workdir = _parse(handle)
        standby.stop(workdir)  # a cancelled run is not requeued: its standby need not wait
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _group_alive(pid) and time.monotonic() < deadline:
            self._reap(pid)
            time.sleep(0.1)
        if _group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S  # a process in uninterruptible I/O goes when its I/O ends
        while _group_alive(pid) and time.monotonic() < deadline:
            self._reap(pid)
            time.sleep(0.05)

    def _reap(self, pid: int) -> None:
        """Collect the job's shell when this process started it (a zombie keeps its group alive)."""
        proc = self._procs.get(str(pid))
        if proc is not None:
            proc.poll()

    def wait(self, handle: JobHandle, timeout: float) -> None:
        """Until the job's shell ends, where this process started it (the run's end is seen at once, not at the next
        poll); else TIMEOUT seconds."""
        proc = self._procs.get(str(_parse(handle)[0]))
        if proc is None:
            time.sleep(timeout)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)

    def logs(self, handle: JobHandle) -> str:
        _, workdir = _parse(handle)
        path = workdir / LOG_FILE
        return path.read_text(errors="replace") if path.is_file() else ""


def _parse(handle: JobHandle) -> tuple[int, Path]:
    pid, _, workdir = handle.job_id.partition(":")
    return int(pid), Path(workdir)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _count_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0
