"""The Hugging Face and Lightning adapters: metrics, checkpoints in the store, exact resume after SIGTERM."""

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.worker import job_pid, launch, standby_pid, train, wait, wait_for_step, wait_until
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, standby
from training_platform.launch.local import LocalLauncher
from training_platform.paths import PlatformHome
from training_platform.registry.script_evaluation import evaluate_script
from training_platform.runs.events import RunEvents
from training_platform.spec import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("home")
    for source in ("sklearn_digits", "python_stdlib_text"):
        build_snapshot(source, root / "snapshots")
    return root


def example(home: Path, framework: str, **training):
    """The example's spec on its snapshot in HOME, checkpoints in HOME, TRAINING's fields changed."""
    spec = load_spec(EXAMPLES / framework / "spec.yaml")
    spec = spec.with_snapshot(build_snapshot(spec.dataset.source, home / "snapshots").snapshot_id)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"store_uri": str(home / "ck")})})
    return spec.model_copy(update={"training": spec.training.model_copy(update=training)})


@pytest.fixture(scope="module")
def straight(home) -> dict[str, dict]:
    """Each framework's example trained once, uninterrupted: the resume must end with its weights, and its final
    checkpoint is what the evaluation tests measure."""
    return {framework: train(home, f"{framework}-straight", example(home, framework))
            for framework in ("hf_trainer", "lightning")}


@pytest.mark.parametrize("framework", ["hf_trainer", "lightning"])
def test_adapter_reports_checkpoints_and_resumes_exactly(home, framework, straight):
    spec = example(home, framework)
    straight = straight[framework]
    assert straight["world_size"] == 2 and straight["final_step"] == 120
    store = open_store(home / "ck")
    assert [m.step for m in store.list(f"{framework}-straight")] == [40, 80, 120]
    progress = [e for e in RunEvents(home / "runs" / f"{framework}-straight").read() if e["kind"] == "progress"]
    assert len(progress) >= 10  # the framework's logs reached the session
    # Its steps are counted though the framework fetches the batches: progress and pace are live.
    telemetry = json.loads((home / "runs" / f"{framework}-straight" / "telemetry.json").read_text())
    assert telemetry["step"] == 120 and telemetry["steps_per_second"] > 0

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


def test_a_lightning_run_is_evaluated_by_its_script_on_its_final_checkpoint(home, straight):
    spec = example(home, "lightning")
    final = open_store(home / "ck").list("lightning-straight")[-1]
    # The shared standby that loaded Lightning, started by the runs' launches, forks the evaluation once it is up.
    log = home / standby.SHARED_LOG_FILE
    wait_until(lambda: "(with lightning)" in log.read_text(), 300, "the standby that loaded Lightning ready")
    measured = evaluate_script(PlatformHome(home), spec, "lightning-straight", final, str(home / "ck"))
    evaluated_in = os.path.realpath(home / "runs" / "lightning-straight" / "evaluations")
    forked = [line for line in log.read_text().splitlines() if "forked worker" in line and evaluated_in in line]
    assert len(forked) == 1 and f"standby {standby_pid(log, '(with lightning)')}:" in forked[0], log.read_text()
    # The module Lightning restored from the final checkpoint, measured on the test split: no step trained.
    assert measured.step == 120 and measured.weights_sha256 == straight["lightning"]["final_weights_sha256"]
    assert set(measured.metrics) == {"accuracy", "loss"} and measured.metrics["accuracy"] > 0.3


def test_a_hf_run_is_evaluated_by_its_script_and_logged_with_the_transformers_flavour(
    home, straight, tmp_path, monkeypatch
):
    import mlflow

    spec = example(home, "hf_trainer")
    final = open_store(home / "ck").list("hf_trainer-straight")[-1]
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)  # this test's registry, gone after it
    client = mlflow.MlflowClient(tracking)
    run = client.create_run(client.create_experiment("hf", artifact_location=str(tmp_path / "artifacts"))).info.run_id
    measured = evaluate_script(
        PlatformHome(home), spec, "hf_trainer-straight", final, str(home / "ck"), tracking_uri=tracking,
        log_model_to=run,
    )
    # The weights of the final checkpoint, loaded without a step trained, measured by train.py's evaluate.
    assert measured.step == 120 and measured.weights_sha256 == straight["hf_trainer"]["final_weights_sha256"]
    assert set(measured.metrics) == {"loss", "perplexity", "accuracy"}
    assert measured.metrics["perplexity"] < 97 / 2  # better than guessing among the 97 characters, by far

    # The registered model generates text through the snapshot's tokenizer, with no hub and no pickle.
    assert mlflow.models.get_model_info(measured.model_uri).flavors.keys() >= {"transformers", "python_function"}
    generator = mlflow.transformers.load_model(measured.model_uri)
    text = generator("def ", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text.startswith("def ") and len(text) == 12


def test_the_hf_callback_refuses_an_interval_the_trainer_cannot_follow():
    from training_platform.train.adapters.hf import PlatformCallback

    spec = load_spec(EXAMPLES / "hf_trainer" / "spec.yaml")
    auto = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"every_steps": "auto"})})
    with pytest.raises(ValueError, match="every_steps: auto"):
        PlatformCallback(SimpleNamespace(spec=auto))
