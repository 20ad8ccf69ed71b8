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


def _request(home: Path, run_id: str, backend: str, spot: bool = False, max_steps: int = 60) -> RunRequest:
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = parse_spec(
        {
            "name": "slurm-parity",
            "team": "qa",
            "owner": "ci",
            "backend": backend,
            "dataset": {"snapshot_id": snapshot},
            "resources": {"nodes": 1, "procs_per_node": 2, "spot": spot},
            "training": {"max_steps": max_steps, "batch_size": 16, "eval_every": 20, "log_every": 10},
            "checkpoint": {"every_steps": 20, "keep_last": 5, "store_uri": str(home / "checkpoints")},
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


def test_slurm_run_matches_local_run(home, slurm_cluster):
    slurm = _run(SlurmLauncher(SlurmConfig(slurm_conf=slurm_cluster.slurm_conf)), _request(home, "on-slurm", "slurm"))
    local = _run(LocalLauncher(visible_gpus=0), _request(home, "on-local", "local"))

    assert slurm["world_size"] == local["world_size"] == 2
    assert slurm["final_step"] == local["final_step"] == 60
    assert [c["step"] for c in slurm["checkpoints"]] == [20, 40, 60]
    assert slurm["final_weights_sha256"] == local["final_weights_sha256"]


def test_preempted_spot_run_is_requeued_and_resumes_to_the_same_weights(home, slurm_cluster, tmp_path):
    """The whole preemption path on real Slurm: an on-demand job needs the CPUs a spot training run
    holds; the run gets SIGTERM, writes an emergency checkpoint, is requeued, resumes, and ends
    bitwise equal to an uninterrupted run."""
    slurm = SlurmLauncher(SlurmConfig(slurm_conf=slurm_cluster.slurm_conf))
    spot = _request(home, "spot-preempted", "slurm", spot=True, max_steps=1500)
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
    # Slurm holds a requeued job back for a while (BeginTime); let it start as soon as it fits.
    slurm_cluster.run("scontrol", "update", f"JobId={handle.job_id}", "StartTime=now")

    resumed = _finish(slurm, handle, spot)
    log = slurm.logs(handle)
    assert "attempt 2" in log and "resumed from checkpoint" in log, log[-3000:]
    assert slurm.status(handle).restarts == 1

    straight = _run(LocalLauncher(visible_gpus=0), _request(home, "spot-reference", "local", max_steps=1500))
    assert resumed["final_step"] == straight["final_step"] == 1500
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
