"""The worker under a real 2-process torchrun (gloo): exact resume from a mid-run checkpoint."""

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.spec import parse_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


def _spec(home: Path, **training):
    snapshot = next((home / "snapshots").glob("*.json")).stem
    return parse_spec(
        {
            "name": "resume",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": 60, "batch_size": 16, "eval_every": 20, "log_every": 5, **training},
            "checkpoint": {"every_steps": 20, "keep_last": 5, "store_uri": str(home / "checkpoints")},
        }
    )


def _launch(home: Path, run_id: str, spec, launcher: LocalLauncher):
    request = RunRequest(spec=spec, run_id=run_id, run_dir=home / "runs" / run_id, env={"TP_HOME": str(home)})
    request.write_spec()
    return launcher.submit(launcher.plan(request))


def _wait(launcher: LocalLauncher, handle, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status(handle)
        if status.state.finished or status.state == JobState.PREEMPTED:
            return status
        time.sleep(0.2)
    raise TimeoutError(launcher.logs(handle)[-2000:])


def _train(home: Path, run_id: str, spec) -> dict:
    launcher = LocalLauncher(visible_gpus=0)
    status = _wait(launcher, _launch(home, run_id, spec, launcher))
    log = (home / "runs" / run_id / LOG_FILE).read_text()
    assert status.state == JobState.SUCCEEDED, log[-3000:]
    return json.loads((home / "runs" / run_id / "result.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(home) -> dict:
    return _train(home, "straight", _spec(home))


def test_uninterrupted_run_checkpoints_and_is_deterministic(home, uninterrupted):
    assert uninterrupted["final_step"] == 60
    assert uninterrupted["world_size"] == 2
    assert [c["step"] for c in uninterrupted["checkpoints"]] == [20, 40, 60]
    again = _train(home, "straight-again", _spec(home))
    assert again["final_weights_sha256"] == uninterrupted["final_weights_sha256"]
    other_seed = _train(home, "other-seed", _spec(home, seed=1))
    assert other_seed["final_weights_sha256"] != uninterrupted["final_weights_sha256"]


def test_resume_from_mid_run_checkpoint_is_exact(home, uninterrupted):
    # Make a run whose newest checkpoint is step 20 of the same spec: copy the manifest, then resume.
    store = open_store(home / "checkpoints")
    mid = next(m for m in store.list("straight") if m.step == 20)
    target = home / "checkpoints" / "runs" / "resumed"
    target.mkdir(parents=True)
    (target / Path(mid.uri).name).write_bytes(Path(mid.uri).read_bytes())

    resumed = _train(home, "resumed", _spec(home))
    assert resumed["resumed_from_step"] == 20
    assert resumed["final_weights_sha256"] == uninterrupted["final_weights_sha256"]


def test_sigterm_writes_emergency_checkpoint_and_resume_is_exact(home, uninterrupted):
    spec = _spec(home, max_steps=400)
    launcher = LocalLauncher(visible_gpus=0)
    handle = _launch(home, "preempted", spec, launcher)
    log = home / "runs" / "preempted" / LOG_FILE
    deadline = time.monotonic() + 120
    while not re.search(r"^step (\d*[1-9]\d*):", log.read_text() if log.exists() else "", re.M):
        assert time.monotonic() < deadline, "worker never reported a step"
        time.sleep(0.1)
    pid = int(handle.job_id.split(":")[0])
    os.killpg(pid, signal.SIGTERM)
    status = _wait(launcher, handle)
    assert status.state == JobState.PREEMPTED, log.read_text()[-3000:]
    preempted_at = max(m.step for m in open_store(home / "checkpoints").list("preempted"))
    assert 0 < preempted_at < 400
    assert f"preempted at step {preempted_at}: emergency checkpoint written" in log.read_text()

    resumed = _train(home, "preempted", spec)
    straight = _train(home, "straight-400", spec)
    assert resumed["resumed_from_step"] == preempted_at
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
