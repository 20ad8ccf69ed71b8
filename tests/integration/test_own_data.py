"""A team's own Parquet files through `tp train`: snapshot, expectations, training, evaluation, registry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import ROOT, last_json, server_logs
from training_platform.datasets import load_manifest
from training_platform.spec.submission import TRAINING_JOB

pytestmark = pytest.mark.integration
EXAMPLE = ROOT / "examples" / "own_data"


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """The example copied where a user keeps it: its data folder, script and spec, trained briefly."""
    shutil.copytree(EXAMPLE / "data", tmp_path / "data")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["training"].update(max_steps=20, eval_every=10, log_every=5)
    spec["checkpoint"] = {"every_steps": 10, "keep_last": 1}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path


def _variant(user_dir: Path, name: str, **dataset) -> Path:
    spec = yaml.safe_load((user_dir / "spec.yaml").read_text())
    spec["dataset"].update(dataset)
    path = user_dir / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_own_parquet_files_train_and_register_a_model(platform, user_dir):
    proc = platform.tp("train", str(user_dir / "spec.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(platform.home)
    result = last_json(proc)
    assert result["status"] == "SUCCEEDED" and result["model_version"] == "1", result
    manifest = load_manifest(platform.home / "snapshots", result["snapshot_id"])
    assert manifest.source == str(user_dir / "data") and manifest.total_rows == 178
    assert manifest.label_names == ["barbera", "barolo", "grignolino"] and manifest.num_features == 13
    # The user's script measured its own model: every metric the spec names, the gate's too.
    assert 0 <= result["test_accuracy"] <= 1 and 0 <= result["test_f1_macro"] <= 1 and result["test_loss"] > 0
    assert result["promoted"] is True and result["gate"] == "no champion yet", result
    version = MlflowClient(tracking_uri=result["tracking_uri"]).get_model_version("wine-classifier", "1")
    assert float(version.tags["test_f1_macro"]) == pytest.approx(result["test_f1_macro"], abs=1e-4)
    assert version.tags["test_split_of"] == result["snapshot_id"]
    assert version.tags["weights_sha256"] == result["final_weights_sha256"]

    # Refused before anything is queued, exit 2, one line naming the problem and the fix.
    with platform.instance() as instance:
        runs_before = instance.get_runs_count()
    nothing = platform.tp("train", str(_variant(user_dir, "none.yaml", source="./nothing/*.parquet")))
    assert nothing.returncode == 2, nothing.stderr[-2000:]
    assert "matches no data files; point it at a file, a directory or a glob" in nothing.stderr
    missing = platform.tp("train", str(_variant(user_dir, "label.yaml", columns={"label": "grape"})))
    assert missing.returncode == 2, missing.stderr[-2000:]
    assert "dataset.columns.label: column 'grape' is not in" in missing.stderr and "cultivar" in missing.stderr
    with platform.instance() as instance:
        assert instance.get_runs_count() == runs_before


def test_files_that_fail_the_specs_expectations_never_train(platform, user_dir):
    strict = _variant(user_dir, "strict.yaml", expectations={"columns": {"alcohol": {"max": 14}}})
    proc = platform.tp("train", str(strict), "--json")
    assert proc.returncode != 0
    result = last_json(proc)
    assert result["status"] == "FAILED", result
    # The failing expectation by name, with its count, where the user looks: the error and `tp snapshots show`.
    assert "alcohol in ..14" in result["error"], result["error"]
    with platform.instance() as instance:
        trained = [run for run in instance.get_runs() if run.job_name == TRAINING_JOB]
    assert [run.tags.get("dagster/partition") for run in trained].count(result["run_id"]) == 0


TEXT_SCRIPT = '''
"""A text classifier on the platform's SDK: it reads each batch's text (batch.text), not numeric features."""
import torch
import torch.nn.functional as F
from torch import nn

from training_platform.train.session import TrainingSession

BUCKETS = 64


def encode(texts: list[str]) -> torch.Tensor:
    """Each text as its characters' frequencies, hashed into buckets."""
    counts = torch.zeros(len(texts), BUCKETS)
    for row, text in enumerate(texts):
        for char in text:
            counts[row, ord(char) % BUCKETS] += 1.0
    return counts / counts.sum(dim=1, keepdim=True).clamp(min=1.0)


def evaluate(model, test):
    with torch.no_grad():
        logits = model(encode(test.text))
    return {"accuracy": (logits.argmax(1) == test.labels).float().mean().item(),
            "loss": F.cross_entropy(logits, test.labels).item()}


with TrainingSession.start() as session:
    session.evaluate_with(evaluate, example=lambda test: encode(test.text[:1]))  # the registry traces on it
    data = session.dataset("train")
    model = nn.Linear(BUCKETS, data.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    step = 0
    if (restored := session.restore()) is not None:
        state, step = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    loss = torch.tensor(0.0)
    while step < session.spec.training.max_steps:
        batch = data[step]
        loss = F.cross_entropy(model(encode(batch.text)), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        state = lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}  # noqa: E731
        if session.after_step(step, state, {"train_loss": loss.detach()}):
            break
    session.finish(model, step, {"train_loss": loss.item()})
'''


def test_a_text_column_reaches_a_script_that_trains_and_registers_a_text_classifier(platform, tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    good, bad = ["great", "good", "lovely", "superb"], ["awful", "dull", "bad", "boring"]
    rows = [(f"a {(good if n % 2 else bad)[n % 4]} film, part {n}", "pos" if n % 2 else "neg") for n in range(240)]
    pa_csv.write_csv(pa.table({"review": [r for r, _ in rows], "sentiment": [s for _, s in rows]}),
                     tmp_path / "reviews.csv")
    (tmp_path / "train.py").write_text(TEXT_SCRIPT)
    spec = {
        "name": "review-sentiment", "team": "nlp", "owner": "ada",
        "entrypoint": {"script": "train.py"},
        "dataset": {"source": "./reviews.csv", "columns": {"label": "sentiment", "text": "review"}},
        "evaluation": {"metrics": ["accuracy", "loss"]},  # measured by the script's evaluate(), then registered
        "training": {"max_steps": 30, "batch_size": 16, "log_every": 10, "eval_every": 10},
        "checkpoint": {"every_steps": 10, "keep_last": 1},
        "resources": {"procs_per_node": 1},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    proc = platform.tp("train", str(tmp_path / "spec.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(platform.home)
    result = last_json(proc)
    assert result["status"] == "SUCCEEDED" and result["model_version"] == "1", result
    manifest = load_manifest(platform.home / "snapshots", result["snapshot_id"])
    assert manifest.role_columns == ["text"] and manifest.feature_columns == [] and manifest.total_rows == 240
    assert 0 <= result["test_accuracy"] <= 1 and result["test_loss"] > 0, result

    # A model template cannot read text: refused before anything is queued.
    spec.pop("entrypoint")
    (tmp_path / "template.yaml").write_text(yaml.safe_dump(spec))
    refused = platform.tp("train", str(tmp_path / "template.yaml"))
    assert refused.returncode == 2 and "model templates read numeric features only" in refused.stderr, refused.stderr
