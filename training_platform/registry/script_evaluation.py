"""Evaluate a checkpoint of a user's script: the script, started again in a process of its own.

The evaluated_model asset calls this for runs of a user's own code: the script builds its model as it does for
training, `session.restore()` hands it the named checkpoint, and `session.finish(model, ...)` measures it on
the test split (train/evaluation_mode.py). The script's code never runs in the orchestrator's process, and
gets the same allow-listed environment as a job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from training_platform.checkpoints import CheckpointManifest
from training_platform.errors import PlatformError
from training_platform.launch import standby
from training_platform.launch.base import python_executable
from training_platform.launch.frameworks import preload_environment
from training_platform.launch.job_env import job_environment
from training_platform.paths import PlatformHome
from training_platform.runs.layout import EVALUATION_FILE
from training_platform.spec import TEMPLATE_METRICS, TrainSpec
from training_platform.train.evaluation_mode import EVALUATION_ENV, EvaluationRequest

LOG_FILE = "evaluation.log"
TIMEOUT_S = 3600.0
NOT_INHERITED = ("TP_SWEEP_CONTEXT", "TP_CHECKPOINT_KEY")  # an evaluation is no trial, and writes no checkpoint


class EvaluationError(PlatformError):
    """The script's evaluation failed, or did not report a metric the spec names."""


@dataclass(frozen=True)
class ScriptEvaluation:
    metrics: dict[str, float]
    test_rows: int
    step: int
    weights_sha256: str
    model_uri: str | None


def evaluate_script(
    home: PlatformHome,
    spec: TrainSpec,
    run_id: str,
    manifest: CheckpointManifest,
    store_uri: str,
    *,
    snapshot_id: str | None = None,
    tracking_uri: str | None = None,
    log_model_to: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> ScriptEvaluation:
    """Run SPEC's script on MANIFEST's checkpoint and the test split of SNAPSHOT_ID (default: the run's own);
    with LOG_MODEL_TO, the measured model is logged into that MLflow run."""
    snapshot_id = snapshot_id or spec.dataset.snapshot_id
    if spec.entrypoint is None or snapshot_id is None:
        raise EvaluationError(f"run {run_id}: only a script's run with a snapshot is evaluated by its script")
    workdir = home.run_dir(run_id) / "evaluations" / f"step{manifest.step}-{snapshot_id[:12]}"
    shutil.rmtree(workdir, ignore_errors=True)  # a re-materialization measures again, from scratch
    workdir.mkdir(parents=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(spec.with_snapshot(snapshot_id).model_dump_json(indent=2))
    request = EvaluationRequest(
        checkpoint_key=manifest.run_id,
        step=manifest.step,
        manifest_sha256=manifest.manifest_sha256,
        store_uri=store_uri,
        tracking_uri=tracking_uri,
        log_model_to=log_model_to,
    )
    request_path = workdir / "request.json"
    request_path.write_text(request.model_dump_json(indent=2))
    env = {k: v for k, v in job_environment().items() if k not in NOT_INHERITED}
    env |= {"TP_HOME": str(home.root), EVALUATION_ENV: str(request_path), "PYTHONUNBUFFERED": "1"}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    module = ["training_platform.train", str(spec_path), "--run-id", run_id]
    if os.environ.get(standby.SHARED_OWNER_ENV, "").isdigit():
        # A `tp server`'s run: the shared standby that loaded what the script imports forks it, as it forks ranks.
        env |= {standby.SHARED_ENV: "1"} | preload_environment(spec)
        module = [standby.__name__, standby.MODULE_ROLE, *module]
    command = [python_executable(), "-m", *module]
    log_path = workdir / LOG_FILE
    with open(log_path, "wb") as log:
        try:
            code = subprocess.run(
                command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            raise EvaluationError(
                f"run {run_id}: the script's evaluation ran past {timeout_s:.0f} s (log: {log_path}); a script "
                "resumed from its final checkpoint must not train again"
            ) from None
    result_path = workdir / EVALUATION_FILE
    if code != 0 or not result_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise EvaluationError(
            f"run {run_id}: the script's evaluation of checkpoint step {manifest.step} exited {code} without a "
            f"result (log: {log_path}):\n{tail}"
        )
    evaluation = _read(result_path)
    _check_reported(spec, evaluation.metrics)
    return evaluation


def _read(path: Path) -> ScriptEvaluation:
    data = json.loads(path.read_text())
    return ScriptEvaluation(
        metrics={str(k): float(v) for k, v in data["metrics"].items()},
        test_rows=int(data["test_rows"]),
        step=int(data["step"]),
        weights_sha256=str(data["weights_sha256"]),
        model_uri=data.get("model_uri"),
    )


def _check_reported(spec: TrainSpec, metrics: dict[str, float]) -> None:
    missing = [name for name in spec.evaluated.metrics if name not in metrics]
    if missing:
        how = (
            "report them from the function the script passes to session.evaluate_with"
            if set(missing) - set(TEMPLATE_METRICS)
            else "return them from the function passed to session.evaluate_with, or leave it out: the default "
            f"evaluation reports {' and '.join(TEMPLATE_METRICS)}"
        )
        raise EvaluationError(
            f"evaluation.metrics names {', '.join(missing)}, which the script's evaluation did not report (it "
            f"reported {', '.join(metrics) or 'nothing'}): {how}, or remove them from evaluation.metrics"
        )
