"""A user's script evaluates its own run: started again on the final checkpoint, it measures the model."""

import shutil
from pathlib import Path

import pytest
import yaml

from tests.fixtures.platform import ROOT
from tests.fixtures.worker import train
from training_platform.checkpoints import open_store
from training_platform.datasets import build_snapshot, load_manifest
from training_platform.paths import PlatformHome
from training_platform.registry.champion import ChampionNotMeasured, remeasure
from training_platform.registry.script_evaluation import EvaluationError, evaluate_script
from training_platform.runs.attempts import finish_attempt
from training_platform.spec import load_spec, parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]
STATE_DICT_FINISH = 'session.finish(model.state_dict(), step, {"train_loss": loss.item()})'


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The byo_torch example trained briefly on one process; its spec, home, result and final checkpoint."""
    user = tmp_path_factory.mktemp("user")
    script = (ROOT / "examples" / "byo_torch" / "train.py").read_text()
    (user / "train.py").write_text(script)
    old_style = script.replace('session.finish(model, step, {"train_loss": loss.item()})', STATE_DICT_FINISH)
    assert old_style != script
    (user / "old_style.py").write_text(old_style)
    spec = yaml.safe_load((ROOT / "examples" / "byo_torch" / "spec.yaml").read_text())
    spec["training"].update(max_steps=20, log_every=5)
    spec["resources"]["procs_per_node"] = 1
    spec["checkpoint"] = {"every_steps": 10, "keep_last": 1}
    (user / "spec.yaml").write_text(yaml.safe_dump(spec))
    home = tmp_path_factory.mktemp("home")
    build_snapshot("sklearn_digits", home / "snapshots")
    snapshot = next((home / "snapshots").glob("*.json")).stem
    loaded = load_spec(user / "spec.yaml").with_snapshot(snapshot)
    loaded = loaded.model_copy(
        update={"checkpoint": loaded.checkpoint.model_copy(update={"store_uri": str(home / "checkpoints")})}
    )
    result = train(home, "byo-eval", loaded)
    final = open_store(home / "checkpoints").list("byo-eval")[-1]
    assert final.step == 20
    return user, loaded, PlatformHome(home), result, final


def test_the_script_measures_its_final_checkpoint_by_default_as_a_classifier(trained):
    _, spec, home, result, final = trained
    measured = evaluate_script(home, spec, "byo-eval", final, str(home.checkpoints))
    assert set(measured.metrics) == {"accuracy", "loss"} and 0 <= measured.metrics["accuracy"] <= 1
    assert measured.weights_sha256 == result["final_weights_sha256"]  # the run's final weights, restored
    assert measured.step == 20 and measured.model_uri is None
    assert measured.test_rows == load_manifest(home.snapshots, spec.dataset.snapshot_id).rows["test"]
    # The evaluation wrote nothing into the run's checkpoints.
    assert [m.step for m in open_store(home.checkpoints).list("byo-eval")] == [20]


def test_a_metric_the_script_does_not_report_fails_the_evaluation_by_name(trained):
    _, spec, home, _, final = trained
    evaluation = {"metrics": ["accuracy", "f1"], "gate": {"metric": "f1"}}
    asks_f1 = parse_spec({**spec.model_dump(mode="json"), "evaluation": evaluation})
    reported = r"evaluation.metrics names f1, which the script's evaluation did not report \(it reported loss, accuracy"
    with pytest.raises(EvaluationError, match=reported):
        evaluate_script(home, asks_f1, "byo-eval", final, str(home.checkpoints))


def test_a_script_that_hands_over_only_a_state_dict_is_told_to_pass_the_model(trained):
    user, spec, home, _, final = trained
    old = spec.entrypoint.model_copy(update={"script": str(user / "old_style.py"), "code": None})
    with pytest.raises(EvaluationError, match="session.finish needs the model itself") as failure:
        evaluate_script(home, spec.model_copy(update={"entrypoint": old}), "byo-eval", final, str(home.checkpoints))
    log = Path(str(failure.value).split("(log: ")[1].split(")")[0])
    assert "Traceback" in log.read_text()
    shutil.rmtree(log.parent)


def test_a_champion_script_is_measured_again_on_another_snapshots_test_split(trained):
    _, spec, home, result, final = trained
    # What the training_run asset records when a run finishes (attempts.finish_attempt), which the gate reads.
    record = {**result, "spec": spec.model_dump(mode="json"), "store_uri": str(home.checkpoints)}
    finish_attempt(home.run_dir("byo-eval"), record)
    newer = build_snapshot("sklearn_digits", home.snapshots, seed=7).snapshot_id  # other rows in its test split
    assert newer != spec.dataset.snapshot_id
    tags = {"training_run": "byo-eval", "weights_sha256": result["final_weights_sha256"]}
    again = remeasure(home, tags, newer)
    own = evaluate_script(home, spec, "byo-eval", final, str(home.checkpoints)).metrics
    assert set(again) == {"accuracy", "loss"} and again["loss"] != own["loss"]
    assert (home.run_dir("byo-eval") / "evaluations" / f"step20-{newer[:12]}" / "evaluation.json").is_file()
    with pytest.raises(ChampionNotMeasured, match="does not hold the registered weights"):
        remeasure(home, {**tags, "weights_sha256": "0" * 64}, newer)
    with pytest.raises(ChampionNotMeasured, match="its training run never-ran's record is not in"):
        remeasure(home, {"training_run": "never-ran"}, newer)
