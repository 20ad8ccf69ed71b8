"""Launch real 2-process torchrun workers through the LocalLauncher and read their results."""

from __future__ import annotations

import json
import time
from pathlib import Path

from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.spec import TrainSpec, parse_spec


def make_spec(home: Path, snapshot_id: str, strategy: str, **overrides) -> TrainSpec:
    body = {
        "name": "strategies",
        "team": "qa",
        "owner": "ci",
        "dataset": {"snapshot_id": snapshot_id},
        "strategy": strategy,
        "training": {"max_steps": 20, "batch_size": 16, "eval_every": 10, "log_every": 5, "learning_rate": 3e-3},
        "checkpoint": {"every_steps": 10, "keep_last": 5, "store_uri": str(home / "checkpoints")},
    }
    for key, value in overrides.items():  # merge one level deep: training={"max_steps": 10} keeps the rest
        body[key] = {**body[key], **value} if isinstance(value, dict) and key in body else value
    return parse_spec(body)


def launch(home: Path, run_id: str, spec: TrainSpec, launcher: LocalLauncher):
    request = RunRequest(spec=spec, run_id=run_id, run_dir=home / "runs" / run_id, env={"TP_HOME": str(home)})
    request.write_spec()
    return launcher.submit(launcher.plan(request))


def wait(launcher: LocalLauncher, handle, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status(handle)
        if status.state.finished or status.state == JobState.PREEMPTED:
            return status
        time.sleep(0.2)
    raise TimeoutError(launcher.logs(handle)[-3000:])


def train(home: Path, run_id: str, spec: TrainSpec) -> dict:
    """Run to the end; the worker's result.json (raises with the log's tail when it failed)."""
    launcher = LocalLauncher(visible_gpus=0)
    status = wait(launcher, launch(home, run_id, spec, launcher))
    log = (home / "runs" / run_id / LOG_FILE).read_text()
    assert status.state == JobState.SUCCEEDED, log[-4000:]
    result = json.loads((home / "runs" / run_id / "result.json").read_text())
    result["log"] = log
    return result
