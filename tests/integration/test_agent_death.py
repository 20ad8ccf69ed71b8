"""A job is all of its processes: when the agent of a local job is SIGKILLed (the OOM killer's pick), at start-up
or while its ranks train and save, nothing of the job is left once the launcher reports it ended, and no checkpoint
appears after that."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.fixtures.worker import job_pid, launch, wait, wait_until
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.local import LocalLauncher
from training_platform.runs.events import RunEvents
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _agent(pgid: int) -> psutil.Process | None:
    """torchrun's process (`python -m training_platform.launch.agent`), not the job's shell that names it."""
    for process in _group(pgid):
        try:
            if process.cmdline()[1:3] == ["-m", "training_platform.launch.agent"]:
                return process
        except psutil.Error:
            continue
    return None


def _ranks_started(pgid: int) -> bool:
    return any("multiprocessing.forkserver" in " ".join(p.cmdline()) and p.children() for p in _group(pgid))


def _writers(pgid: int) -> list[psutil.Process]:
    """The ranks' checkpoint writers: in a session of their own, so outside the job's group."""
    found = []
    for process in _group(pgid):
        try:
            found += [c for c in process.children() if "training_platform.checkpoints.writer_process" in c.cmdline()]
        except psutil.Error:
            continue
    return found


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _stepped(home, run_id: str, step: int) -> bool:
    return any(e["kind"] == "progress" and e["step"] >= step for e in RunEvents(home / "runs" / run_id).read())


def _saved(home, run_id: str) -> bool:
    return any(e["kind"] == "checkpoint" for e in RunEvents(home / "runs" / run_id).read())


MOMENTS = {
    "start-up": lambda home, run_id, pgid: _agent(pgid) is not None,
    "ranks-forked": lambda home, run_id, pgid: _ranks_started(pgid),
    "training-after-a-save": lambda home, run_id, pgid: _saved(home, run_id) and _stepped(home, run_id, 60),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_killed_agent_takes_every_process_of_its_job_with_it(home, moment):
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = parse_spec({
        "name": "agent-dies", "team": "qa", "owner": "ci", "dataset": {"snapshot_id": snapshot},
        "training": {"max_steps": 100000, "batch_size": 16, "eval_every": 100000, "log_every": 10},
        "checkpoint": {"every_steps": 50, "keep_last": 100, "store_uri": str(home / "checkpoints")},
    })
    run_id = f"agent-dies-{moment}"
    launcher = LocalLauncher(visible_gpus=0)
    handle = launch(home, run_id, spec, launcher)
    pgid = job_pid(handle)
    wait_until(lambda: MOMENTS[moment](home, run_id, pgid), 120, f"the job to reach {moment}")
    agent = _agent(pgid)
    assert agent is not None, "the agent ended before it could be killed"
    writers = _writers(pgid)
    assert writers or moment != "training-after-a-save", "the rank that saved has no checkpoint writer"
    agent.send_signal(signal.SIGKILL)

    status = wait(launcher, handle)
    assert status.state == JobState.FAILED, status
    saved_when_reported = [m.step for m in open_store(home / "checkpoints").list(run_id)]
    # SIGKILLed as the job ended (the kernel may take a moment to take them off the process table).
    wait_until(lambda: not _group(pgid), 5, f"the job's processes gone after it was reported {status.state}")
    # A writer leaves once its rank is gone, abandoning any save whose manifest was not out.
    wait_until(lambda: all(_gone(w) for w in writers), 30, "the checkpoint writers gone after their ranks")
    # Nothing trains on into the failed run: its checkpoints are the ones it had when it was reported.
    assert [m.step for m in open_store(home / "checkpoints").list(run_id)] == saved_when_reported
