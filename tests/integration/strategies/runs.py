"""Launch real 2-process torchrun workers through the LocalLauncher and read their results."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures import worker
from training_platform.launch.local import LOG_FILE
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


def train(home: Path, run_id: str, spec: TrainSpec) -> dict:
    """Run to the end; the worker's result.json plus its log (raises with the log's tail when it failed)."""
    result = worker.train(home, run_id, spec)
    result["log"] = (home / "runs" / run_id / LOG_FILE).read_text()
    return result
