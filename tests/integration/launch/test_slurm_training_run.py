"""A real 2-process training run through SlurmLauncher ends with the same weights as the local launcher."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LocalLauncher
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


# Long enough for a preemption to land mid-run (a step takes milliseconds here), short enough for CI.
STEPS = 600


def _request(home: Path, run_id: str, backend: str, spot: bool = False) -> RunRequest:
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = parse_spec(
        {
            "name": "slurm-parity",
            "team": "qa",
            "owner": "ci",
            "backend": backend,
            "dataset": {"snapshot_id": snapshot},
            "resources": {"nodes": 1, "procs_per_node": 2, "spot": spot},
            "training": {"max_steps": STEPS, "batch_size": 16, "eval_every": 20, "log_every": 10},
            "checkpoint": {"every_steps": 50, "keep_last": 3, "store_uri": str(home / "checkpoints")},
        }
    )
    return RunRequest(spec=spec, run_id=run_id, run_dir=home / "runs" / run_id, env={"TP_HOME": str(home)})


def _run(launcher, request: RunRequest, timeout: float = 300) -> dict:
    request.write_spec()
    return _finish(launcher, launcher.submit(launcher.plan(request)), request, timeout)


def _finish(launcher, handle, request: RunRequest, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    status = launcher.status(handle)
    while not status.state.finished:
        assert time.monotonic() < deadline, launcher.logs(handle)[-3000:]
        time.sleep(0.5)
        status = launcher.status(handle)
    assert status.state is JobState.SUCCEEDED, f"{status}\n{launcher.logs(handle)[-3000:]}"
    return json.loads((request.run_dir / "result.json").read_text())


@pytest.fixture(scope="module")
def local_run(home) -> dict:
    """The same spec on the local launcher, uninterrupted: the reference for every Slurm run."""
    return _run(LocalLauncher(visible_gpus=0), _request(home, "on-local", "local"))


def test_slurm_run_matches_local_run(home, slurm_cluster, local_run):
    slurm = _run(SlurmLauncher(SlurmConfig(slurm_conf=slurm_cluster.slurm_conf)), _request(home, "on-slurm", "slurm"))

    assert slurm["world_size"] == local_run["world_size"] == 2
    assert slurm["final_step"] == local_run["final_step"] == STEPS
    assert [c["step"] for c in slurm["checkpoints"]] == [STEPS - 100, STEPS - 50, STEPS]
    assert slurm["final_weights_sha256"] == local_run["final_weights_sha256"]


def _start_now(cluster, job_id: str, timeout: float = 60) -> None:
    """Slurm holds a requeued job back for two minutes (Reason=BeginTime); let it start when it fits.
    The hold is set once the requeue has completed, so an earlier update would be overwritten."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        if "JobState=PENDING" in job and "Reason=BeginTime" in job:
            cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        # Reason=None: the requeue has not completed, and its hold may still come.
        elif ("JobState=PENDING" in job and "Reason=None" not in job) or "JobState=RUNNING" in job:
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} was not released: {job}")


def test_preempted_spot_run_is_requeued_and_resumes_to_the_same_weights(home, slurm_cluster, local_run, tmp_path):
    """The whole preemption path on real Slurm: an on-demand job needs the CPUs a spot training run
    holds; the run gets SIGTERM, writes an emergency checkpoint, is requeued, resumes, and ends
    bitwise equal to an uninterrupted run."""
    slurm = SlurmLauncher(SlurmConfig(slurm_conf=slurm_cluster.slurm_conf))
    spot = _request(home, "spot-preempted", "slurm", spot=True)
    spot.write_spec()
    handle = slurm.submit(slurm.plan(spot))
    deadline = time.monotonic() + 180
    while not list((home / "checkpoints" / "runs" / "spot-preempted").glob("*.json")):
        assert time.monotonic() < deadline, slurm.logs(handle)[-3000:]
        time.sleep(0.5)

    # Both CPUs of the node are the spot run's; this on-demand job preempts it.
    probe = RunRequest(
        spec=parse_spec({"name": "urgent", "team": "qa", "owner": "ci", "resources": {"procs_per_node": 1}}),
        run_id="urgent",
        run_dir=tmp_path / "urgent",
        env={"PYTHONPATH": str(Path(__file__).parent), "TP_PROBE_DIR": str(tmp_path / "urgent")},
    )
    probe_launcher = SlurmLauncher(SlurmConfig(worker_module="probe_worker", slurm_conf=slurm_cluster.slurm_conf))
    probe_handle = probe_launcher.submit(probe_launcher.plan(probe))

    status = slurm.status(handle)
    while status.state is not JobState.REQUEUED:
        assert time.monotonic() < deadline and not status.state.finished, f"{status}\n{slurm.logs(handle)[-3000:]}"
        time.sleep(0.3)
        status = slurm.status(handle)
    assert status.preemptions == 1 and status.restarts == 1
    assert probe_launcher.status(probe_handle).state is not JobState.FAILED
    _start_now(slurm_cluster, handle.job_id)

    resumed = _finish(slurm, handle, spot)
    log = slurm.logs(handle)
    assert "attempt 2" in log and "resumed from checkpoint" in log, log[-3000:]
    assert slurm.status(handle).restarts == 1

    assert resumed["final_step"] == STEPS
    assert resumed["final_weights_sha256"] == local_run["final_weights_sha256"]
