"""A team's own Parquet files through `tp train`: snapshot, expectations, training, evaluation, registry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import ROOT, last_json, server_logs
from training_platform.datasets import load_manifest
from training_platform.submission import TRAINING_JOB

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
