"""On real Slurm too, a job is all of its processes: when torchrun's agent is SIGKILLed (the OOM killer's pick)
while its ranks train and save, the job is reported FAILED, no process of it is left 10 s later (ranks, fork
server, checkpoint writers) and no checkpoint appears after it was reported."""

from __future__ import annotations

import contextlib
import signal

import psutil
import pytest

from tests.fixtures.worker import wait_until
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.errors import LaunchError
from training_platform.launch import JobState
from training_platform.launch.base import RunRequest
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher
from training_platform.runs.events import RunEvents
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
SLURM_WAIT_SECONDS = 240


def _processes_of(job_id: str) -> list[psutil.Process]:
    """Every live process the job started: they carry its SLURM_JOB_ID (slurmstepd, Slurm's own, does not)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get("SLURM_JOB_ID") == job_id:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _agent(job_id: str) -> psutil.Process | None:
    for process in _processes_of(job_id):
        try:
            if process.cmdline()[1:3] == ["-m", "training_platform.launch.agent"]:
                return process
        except psutil.Error:
            continue
    return None


def _writers(job_id: str) -> list[psutil.Process]:
    found = []
    for process in _processes_of(job_id):
        try:
            if "training_platform.checkpoints.writer_process" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_killed_agent_takes_every_process_of_its_slurm_job_with_it(tmp_path, slurm_cluster):
    home = tmp_path / "home"
    snapshot = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
    store = home / "checkpoints"
    spec = parse_spec(
        {
            "name": "agent-dies",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "resources": {"procs_per_node": 2},
            "training": {"max_steps": 100000, "batch_size": 16, "eval_every": 100000, "log_every": 10},
            "checkpoint": {"every_steps": 50, "keep_last": 100, "store_uri": str(store)},
        }
    )
    run_id = "agent-dies"
    request = RunRequest(spec=spec, run_id=run_id, run_dir=home / "runs" / run_id, env={"TP_HOME": str(home)})
    request.write_spec()
    launcher = SlurmLauncher(SlurmConfig(slurm_conf=slurm_cluster.slurm_conf))
    handle = launcher.submit(launcher.plan(request))
    events = RunEvents(request.run_dir)

    def training_after_a_save() -> bool:
        log = events.read()
        return any(e["kind"] == "checkpoint" for e in log) and any(
            e["kind"] == "progress" and e["step"] >= 120 for e in log
        )

    try:
        wait_until(training_after_a_save, SLURM_WAIT_SECONDS, "the job to train on after a save", poll=0.2)
        agent = _agent(handle.job_id)
        assert agent is not None, "no torchrun agent among the job's processes"
        writers = _writers(handle.job_id)
        assert writers, "the ranks that saved have no checkpoint writer"
        agent.send_signal(signal.SIGKILL)

        status = wait_until(
            lambda: (s := launcher.status(handle)).state.finished and s, SLURM_WAIT_SECONDS, "the job's end", poll=0.5
        )
        assert status.state == JobState.FAILED, status
        saved_when_reported = [m.step for m in open_store(store).list(run_id)]
        try:
            wait_until(lambda: not _processes_of(handle.job_id), 10, "every process of the job gone", poll=0.2)
        except TimeoutError:
            left = [f"{p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:160]}" for p in _processes_of(handle.job_id)]
            pytest.fail("10 s after the job was reported FAILED, these processes of it were alive:\n" + "\n".join(left))
        # Nothing trains on into the failed run: its checkpoints are the ones it had when it was reported.
        assert [m.step for m in open_store(store).list(run_id)] == saved_when_reported
    finally:
        with contextlib.suppress(LaunchError):  # a job already ended
            launcher.cancel(handle)
        for process in _processes_of(handle.job_id):  # what a failed check found alive trains on otherwise
            with contextlib.suppress(psutil.Error):
                process.kill()
