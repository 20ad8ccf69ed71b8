"""A user's own train.py, outside the package, on the worker SDK: lineage, checkpoints, preemption."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import ROOT, server_logs
from tests.fixtures.worker import job_pid, launch, train, wait, wait_for_step
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.runs.layout import TELEMETRY_FILE
from training_platform.spec import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]

FAILING_SCRIPT = """
import torch
from training_platform.train.session import TrainingSession

session = TrainingSession.start()
weights = torch.zeros(4)
for step in range(1, 31):
    weights += 1
    if step == 20:
        session.save({"model": {"w": weights}}, step)
    if step == 25:
        raise ValueError("labels out of range: 11")
"""

FORGETS_FINISH = """
import torch
from training_platform.train.session import TrainingSession

with TrainingSession.start() as session:
    weights = torch.zeros(4)
    for step in range(1, 11):
        weights += 1
        if session.after_step(step, lambda: {"model": {"w": weights}}, {"w": weights.sum()}):
            break
"""


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """The example script copied outside the package, with a spec beside it, as a user would have it."""
    root = tmp_path_factory.mktemp("user")
    shutil.copy(ROOT / "examples" / "byo_torch" / "train.py", root / "train.py")
    spec = yaml.safe_load((ROOT / "examples" / "byo_torch" / "spec.yaml").read_text())
    spec["training"].update(max_steps=120, log_every=5)
    spec["checkpoint"]["every_steps"] = 40
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    (root / "fails.py").write_text(FAILING_SCRIPT)
    spec["entrypoint"] = {"script": "fails.py"}
    (root / "fails.yaml").write_text(yaml.safe_dump(spec))
    (root / "forgets.py").write_text(FORGETS_FINISH)
    spec["entrypoint"] = {"script": "forgets.py"}
    (root / "forgets.yaml").write_text(yaml.safe_dump(spec))
    return root


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


def _spec(user_dir: Path, home: Path, name: str = "spec.yaml"):
    spec = load_spec(user_dir / name)
    snapshot = next((home / "snapshots").glob("*.json")).stem
    store = {"store_uri": str(home / "checkpoints")}
    return spec.with_snapshot(snapshot).model_copy(update={"checkpoint": spec.checkpoint.model_copy(update=store)})


def test_user_script_resumes_exactly_after_sigterm(user_dir, home):
    spec = _spec(user_dir, home)
    assert spec.entrypoint.script == str(user_dir / "train.py")  # resolved relative to the spec file
    straight = train(home, "byo-straight", spec)
    assert straight["world_size"] == 2 and straight["final_step"] == 120
    # The script calls only after_step: its steps still reach telemetry (tp runs, the deadline's pace).
    telemetry = json.loads((home / "runs" / "byo-straight" / TELEMETRY_FILE).read_text())
    assert telemetry["step"] == 120 and telemetry["figures"]["steps"] == 120, telemetry

    launcher = LocalLauncher(visible_gpus=0)
    handle = launch(home, "byo-preempted", spec, launcher)
    wait_for_step(home, "byo-preempted", 10)
    os.killpg(job_pid(handle), signal.SIGTERM)
    assert wait(launcher, handle).state == JobState.PREEMPTED
    resumed = train(home, "byo-preempted", spec)
    assert 0 < resumed["resumed_from_step"] < 120
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
    assert [c["step"] for c in resumed["checkpoints"]][-1] == 120


def test_a_failing_script_reports_its_exception_and_keeps_its_checkpoint(user_dir, home):
    spec = _spec(user_dir, home, "fails.yaml")
    launcher = LocalLauncher(visible_gpus=0)
    status = wait(launcher, launch(home, "byo-fails", spec, launcher))
    assert status.state == JobState.FAILED
    assert status.reason.startswith("ValueError: labels out of range: 11")
    log = (home / "runs" / "byo-fails" / LOG_FILE).read_text()
    assert 'fails.py", line' in log and "Traceback" in log
    assert [m.step for m in open_store(home / "checkpoints").list("byo-fails")] == [20]


def test_a_script_that_never_calls_finish_fails_with_the_fix(user_dir, home):
    spec = _spec(user_dir, home, "forgets.yaml")
    launcher = LocalLauncher(visible_gpus=0)
    status = wait(launcher, launch(home, "byo-forgets", spec, launcher))
    assert status.state == JobState.FAILED
    assert status.reason.startswith("RuntimeError: the script left `with TrainingSession.start()` without "
                                    "session.finish(model, step, metrics)"), status.reason


def test_user_script_through_tp_train_reaches_mlflow_and_dagster(user_dir, platform):
    proc = platform.tp("train", str(user_dir / "spec.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:] + server_logs(platform.home)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "SUCCEEDED" and summary["final_step"] == 120
    assert [c["step"] for c in summary["checkpoints"]] == [40, 80, 120]
    run = MlflowClient(tracking_uri=summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert (
        len(MlflowClient(tracking_uri=summary["tracking_uri"]).get_metric_history(run.info.run_id, "train_loss")) >= 20
    )
    assert (
        run.data.tags["script_sha256"] == __import__("hashlib").sha256((user_dir / "train.py").read_bytes()).hexdigest()
    )


def test_a_script_gone_from_the_submitters_disk_still_runs_as_submitted(user_dir, platform, tmp_path):
    """The server runs the text `tp` read at submission: a server on another machine never had the file."""
    from tests.integration.server.runs import detach, ended_row

    laptop = tmp_path / "laptop"
    shutil.copytree(user_dir, laptop)
    run_id = detach(platform, laptop / "spec.yaml")
    shutil.rmtree(laptop)  # before the run starts: nothing of it is left on the submitter's side
    row = ended_row(platform, run_id)
    assert row["state"] == "SUCCEEDED", server_logs(platform.home)
    shipped = next((platform.home / "runs" / run_id / "code").glob("*/train.py"))
    assert shipped.read_bytes() == (user_dir / "train.py").read_bytes()
    result = json.loads((platform.home / "runs" / run_id / "result.json").read_text())
    assert result["final_step"] == 120
