"""The Hugging Face and Lightning adapters: metrics, checkpoints in the store, exact resume after SIGTERM."""

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.worker import job_pid, launch, train, wait, wait_for_step
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.local import LocalLauncher
from training_platform.paths import PlatformHome
from training_platform.runlog import RunEvents
from training_platform.script_evaluation import evaluate_script
from training_platform.spec import load_spec

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


@pytest.mark.parametrize("framework", ["hf_trainer", "lightning"])
def test_adapter_reports_checkpoints_and_resumes_exactly(home, framework):
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = load_spec(EXAMPLES / framework / "spec.yaml").with_snapshot(snapshot)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"store_uri": str(home / "ck")})})
    straight = train(home, f"{framework}-straight", spec)
    assert straight["world_size"] == 2 and straight["final_step"] == 120
    store = open_store(home / "ck")
    assert [m.step for m in store.list(f"{framework}-straight")] == [40, 80, 120]
    progress = [e for e in RunEvents(home / "runs" / f"{framework}-straight").read() if e["kind"] == "progress"]
    assert len(progress) >= 10  # the framework's logs reached the session

    run_id = f"{framework}-preempted"
    launcher = LocalLauncher(visible_gpus=0)
    handle = launch(home, run_id, spec, launcher)
    wait_for_step(home, run_id, 25)  # before the middle: a resumed loop must not mistake the epoch length
    os.killpg(job_pid(handle), signal.SIGTERM)
    assert wait(launcher, handle).state == JobState.PREEMPTED
    emergency = max(m.step for m in store.list(run_id))
    assert emergency >= 25

    resumed = train(home, run_id, spec)
    assert resumed["resumed_from_step"] == emergency
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]


def test_a_lightning_run_is_evaluated_by_its_script_on_its_final_checkpoint(home):
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = load_spec(EXAMPLES / "lightning" / "spec.yaml").with_snapshot(snapshot)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"store_uri": str(home / "ck")})})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"max_steps": 40})})
    trained = train(home, "lightning-evaluated", spec)
    final = open_store(home / "ck").list("lightning-evaluated")[-1]
    measured = evaluate_script(PlatformHome(home), spec, "lightning-evaluated", final, str(home / "ck"))
    # The module Lightning restored from the final checkpoint, measured on the test split: no step trained.
    assert measured.step == 40 and measured.weights_sha256 == trained["final_weights_sha256"]
    assert set(measured.metrics) == {"accuracy", "loss"} and measured.metrics["accuracy"] > 0.3


def test_the_hf_callback_refuses_an_interval_the_trainer_cannot_follow():
    from training_platform.train.adapters.hf import PlatformCallback

    spec = load_spec(EXAMPLES / "hf_trainer" / "spec.yaml")
    auto = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"every_steps": "auto"})})
    with pytest.raises(ValueError, match="every_steps: auto"):
        PlatformCallback(SimpleNamespace(spec=auto))
