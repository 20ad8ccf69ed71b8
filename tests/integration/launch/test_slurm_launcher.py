"""SlurmLauncher against the real local Slurm cluster: submit, watch, preempt, requeue, cancel.

The jobs run `probe_worker` (next to this file) instead of the trainer: it records which rank
and attempt ran and stops like the worker on SIGTERM, so these tests exercise sbatch, srun,
torchrun and Slurm's signals, not training.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from training_platform.checkpoints.durable import DurableCheckpoint
from training_platform.errors import LaunchError, SpecError
from training_platform.launch.base import JobHandle, JobState, JobStatus, RunRequest
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher
from training_platform.recovery.preemption import summarize
from training_platform.runs.events import TIME_LIMIT, RunEvents
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

PROBE_DIR = Path(__file__).parent


def _request(
    tmp_path: Path, run_id: str, seconds: float = 0, grace: int = 10, slurm: dict | None = None, **resources
) -> RunRequest:
    spec = parse_spec(
        {
            "name": "probe",
            "team": "ml",
            "owner": "tests",
            "resources": resources,
            "checkpoint": {"grace_period_seconds": grace},
            "slurm": slurm or {},
        }
    )
    run_dir = tmp_path / run_id
    env = {
        "PYTHONPATH": str(PROBE_DIR),
        "TP_PROBE_DIR": str(run_dir),
        "TP_PROBE_SECONDS": str(seconds),
        "TP_PROBE_SECRET": "do-not-write-me",
    }
    return RunRequest(spec=spec, run_id=run_id, run_dir=run_dir, env=env)


@pytest.fixture
def launcher(slurm_cluster) -> SlurmLauncher:
    return SlurmLauncher(SlurmConfig(worker_module="probe_worker", slurm_conf=slurm_cluster.slurm_conf))


def _wait(
    launcher: SlurmLauncher, handle: JobHandle, done: Callable[[JobStatus], bool], timeout: float = 120
) -> list[JobStatus]:
    seen: list[JobStatus] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status(handle)
        if not seen or seen[-1] != status:
            seen.append(status)
        if done(status):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"job {handle.job_id} did not get there in {timeout}s; states seen: {seen}")


def _seconds(run_time: str) -> int:
    """Slurm's `[days-]hh:mm:ss` as seconds."""
    days, _, clock = run_time.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def _wait_for_file(pattern: str, where: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not list(where.glob(pattern)):
        assert time.monotonic() < deadline, f"no {pattern} in {where} after {timeout}s"
        time.sleep(0.2)


def test_two_process_job_runs_to_success(tmp_path, launcher):
    request = _request(tmp_path, "ok", procs_per_node=2)
    handle = launcher.submit(launcher.plan(request))

    seen = _wait(launcher, handle, lambda s: s.state.finished)

    assert seen[-1].state is JobState.SUCCEEDED, seen
    assert seen[-1].exit_code == 0
    assert {p.name for p in request.run_dir.glob("finished-rank*")} == {"finished-rank0", "finished-rank1"}
    assert "probe rank 1 of 2 attempt 1 started" in launcher.logs(handle)
    # The environment travels with sbatch; nothing the caller passed is written into the script.
    assert "do-not-write-me" not in (request.run_dir / "job.sbatch").read_text()
    assert "do-not-write-me" in (request.run_dir / "started-rank0-attempt1").read_text()


def test_spot_job_preempted_by_ondemand_job_is_checkpointed_and_requeued(tmp_path, launcher):
    spot = _request(tmp_path, "spot", seconds=600, procs_per_node=1, gpus_per_node=4, spot=True)
    spot_handle = launcher.submit(launcher.plan(spot))
    _wait_for_file("started-rank0-attempt1", spot.run_dir)
    assert launcher.status(spot_handle).state is JobState.RUNNING

    urgent = _request(tmp_path, "urgent", seconds=1, procs_per_node=1, gpus_per_node=1, spot=False)
    urgent_handle = launcher.submit(launcher.plan(urgent))

    seen = _wait(launcher, spot_handle, lambda s: s.state in (JobState.PREEMPTED, JobState.REQUEUED), 90)
    preempted = seen[-1]
    assert preempted.restarts >= 1 or preempted.state is JobState.PREEMPTED, seen
    assert preempted.preemptions >= 1
    # The worker saw SIGTERM inside the grace time: that is when it writes its emergency checkpoint.
    assert (spot.run_dir / "sigterm-rank0-attempt1").exists()
    assert _wait(launcher, urgent_handle, lambda s: s.state.finished)[-1].state is JobState.SUCCEEDED

    launcher.cancel(spot_handle)
    final = _wait(launcher, spot_handle, lambda s: s.state.finished, 60)[-1]
    assert final.state is JobState.CANCELLED
    assert final.restarts >= 1


def test_the_spot_run_that_checkpointed_last_makes_room_for_an_ondemand_run(tmp_path, launcher):
    """Slurm alone preempts the oldest of equal spot jobs; the platform preempts the one that loses least."""
    stale = _request(tmp_path, "stale", seconds=600, procs_per_node=1, gpus_per_node=2, spot=True)
    stale_handle = launcher.submit(launcher.plan(stale))
    _wait_for_file("started-rank0-attempt1", stale.run_dir)
    fresh = _request(tmp_path, "fresh", seconds=600, procs_per_node=1, gpus_per_node=2, spot=True)
    fresh_handle = launcher.submit(launcher.plan(fresh))
    _wait_for_file("started-rank0-attempt1", fresh.run_dir)
    # The node is full (both CPUs, all four GPUs). The older run saved an hour ago, the younger a moment ago.
    launcher.publish_checkpoint(stale_handle, DurableCheckpoint(100, time.time() - 3600))
    launcher.publish_checkpoint(fresh_handle, DurableCheckpoint(100, time.time() - 2))

    urgent = _request(tmp_path, "urgent", seconds=1, procs_per_node=1, gpus_per_node=2, spot=False)
    urgent_handle = launcher.submit(launcher.plan(urgent))

    _wait(launcher, fresh_handle, lambda s: s.restarts >= 1, 90)
    assert (fresh.run_dir / "sigterm-rank0-attempt1").exists()  # it checkpointed in its grace time
    assert _wait(launcher, urgent_handle, lambda s: s.state.finished)[-1].state is JobState.SUCCEEDED
    kept = launcher.status(stale_handle)
    assert (kept.state, kept.restarts) == (JobState.RUNNING, 0), kept
    assert not list(stale.run_dir.glob("sigterm-*"))

    for handle in (stale_handle, fresh_handle):
        launcher.cancel(handle)
        assert _wait(launcher, handle, lambda s: s.state.finished, 60)[-1].state is JobState.CANCELLED


@pytest.mark.timeout(420)
def test_a_run_stopped_at_its_time_limit_checkpoints_and_is_requeued_but_not_as_a_preemption(
    tmp_path, launcher, slurm_cluster
):
    """Slurm signals the batch shell `grace` seconds before the limit (--signal=B:TERM@grace): the workers get
    SIGTERM and checkpoint (srun, signalled itself, killed them), and the run's log says it was the time limit.

    Slurm sends that signal up to a minute early, so a one-minute limit could signal a worker still starting (seen
    on a busy machine: nothing to checkpoint yet). The job starts with ten minutes, and once its worker runs, its
    limit is cut to the first whole minute that leaves the worker its grace and a little more: the signal comes
    within a minute, and the limit itself no sooner than the grace after it."""
    grace = 25
    request = _request(tmp_path, "limit", seconds=600, grace=grace, slurm={"time_limit": "10"}, procs_per_node=1)
    handle = launcher.submit(launcher.plan(request))
    _wait_for_file("started-rank0-attempt1", request.run_dir, 120)
    record = slurm_cluster.run("scontrol", "show", "job", "-o", handle.job_id).stdout
    elapsed_s = _seconds(re.search(r"RunTime=(\S+)", record).group(1))
    minutes = math.ceil((elapsed_s + grace + 10) / 60)
    limit = slurm_cluster.run("scontrol", "update", f"JobId={handle.job_id}", f"TimeLimit={minutes}")
    assert limit.returncode == 0, limit.stderr

    seen = _wait(launcher, handle, lambda s: s.restarts >= 1, 240)
    status = seen[-1]

    assert (request.run_dir / "sigterm-rank0-attempt1").exists()  # the emergency checkpoint's turn
    assert "tp: SIGTERM (time_limit)" in launcher.logs(handle)
    # The attempt's end is the time limit in the run's log, which is what a requeued status's reason is read from.
    # That status lasts only until attempt 2 starts: on a busy machine the polls above may see attempt 2 first.
    assert TIME_LIMIT in [event["kind"] for event in RunEvents(request.run_dir).read()]
    requeued = [s for s in seen if s.state is JobState.REQUEUED]
    assert all(s.reason.startswith("requeued at its time limit") for s in requeued), requeued
    summary = summarize(RunEvents(request.run_dir).read())
    assert status.preemptions >= 1 and summary.preemptions_with(status) == 0, (status, summary)
    launcher.cancel(handle)
    assert _wait(launcher, handle, lambda s: s.state.finished, 60)[-1].state is JobState.CANCELLED


def test_unknown_partition_is_refused_before_submission(tmp_path, launcher):
    spec = _request(tmp_path, "bad").spec
    spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"partition": "gpu-xl"})})
    request = RunRequest(spec=spec, run_id="bad", run_dir=tmp_path / "bad")
    with pytest.raises(SpecError, match=r"slurm.partition: Slurm partition 'gpu-xl' does not exist.*ondemand"):
        launcher.submit(launcher.plan(request))
    assert not (tmp_path / "bad" / "job.sbatch").exists()


def test_more_gpus_per_node_than_the_nodes_have_is_refused(tmp_path, launcher):
    request = _request(tmp_path, "big", procs_per_node=1, gpus_per_node=8)
    with pytest.raises(SpecError, match=r"resources.gpus_per_node: 8 GPUs per node .* at most 4"):
        launcher.submit(launcher.plan(request))


def test_gpu_type_the_cluster_lacks_is_refused(tmp_path, launcher):
    request = _request(tmp_path, "h100", procs_per_node=1, gpus_per_node=1, gpu_type="H100")
    with pytest.raises(SpecError, match=r"of type 'h100' .* at most 0 \(they offer: gpu:4\).*resources.gpu_type"):
        launcher.submit(launcher.plan(request))


def test_sbatch_refusal_is_surfaced_verbatim(tmp_path, slurm_cluster):
    unchecked = SlurmLauncher(
        SlurmConfig(
            worker_module="probe_worker",
            slurm_conf=slurm_cluster.slurm_conf,
            check_cluster=False,
            ondemand_partition="no-such-partition",
        )
    )
    with pytest.raises(LaunchError, match=r"(?s)sbatch refused.*invalid partition specified.*sinfo"):
        unchecked.submit(unchecked.plan(_request(tmp_path, "refused")))
