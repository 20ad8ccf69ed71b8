"""The whole pipeline through the `tp` command line: real Dagster, MLflow, torchrun and GX."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import mlflow
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from training_platform.tracking import CHAMPION_ALIAS, REQUIRED_TAGS, model_requirements

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TP = str(Path(sys.executable).with_name("tp"))


@pytest.fixture(scope="module")
def tp_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tp-home")


def run_tp(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI")}
    env["TP_HOME"] = str(home)
    return subprocess.run([TP, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def demo(tp_home) -> dict:
    proc = run_tp(tp_home, "demo", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc)


def test_demo_trains_evaluates_and_registers(demo):
    assert demo["status"] == "SUCCEEDED"
    assert demo["final_step"] == 300
    assert demo["test_accuracy"] > 0.9
    assert demo["model_name"] == "digits-classifier"
    assert demo["model_version"] == "1"
    assert demo["promoted"] is True
    assert len(demo["final_weights_sha256"]) == 64
    assert demo["checkpoints"][-1]["step"] == 300


def test_dagster_records_every_asset_with_lineage(demo, tp_home):
    os.environ["DAGSTER_HOME"] = str(tp_home / "dagster")
    try:
        with dg.DagsterInstance.get() as instance:
            snapshot = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
            assert snapshot.asset_materialization.metadata["snapshot_id"].value == demo["snapshot_id"]
            assert demo["run_id"] in instance.get_dynamic_partitions("training_runs")
            for key in ("training_run", "checkpoints", "evaluated_model", "registered_model"):
                event = instance.get_latest_materialization_event(dg.AssetKey(key))
                assert event is not None, key
                assert event.asset_materialization.partition == demo["run_id"]
            run = instance.get_latest_materialization_event(dg.AssetKey("training_run")).asset_materialization
            lineage = run.metadata["lineage"].value
            assert lineage["snapshot_id"] == demo["snapshot_id"]
            assert run.metadata["final_weights_sha256"].value == demo["final_weights_sha256"]
            assert run.metadata["world_size"].value == 2  # reported by the worker itself, through Pipes
    finally:
        del os.environ["DAGSTER_HOME"]


def test_mlflow_run_has_required_tags_metrics_and_champion(demo):
    client = MlflowClient(tracking_uri=demo["tracking_uri"])
    run = client.get_run(demo["mlflow_run_id"])
    assert set(REQUIRED_TAGS) <= set(run.data.tags)
    assert run.data.tags["snapshot_id"] == demo["snapshot_id"]
    assert run.data.tags["candidate_status"] == "champion"
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "train_loss")) >= 10
    assert run.data.metrics["test_accuracy"] == pytest.approx(demo["test_accuracy"], abs=1e-4)
    champion = client.get_model_version_by_alias(demo["model_name"], CHAMPION_ALIAS)
    assert str(champion.version) == "1"
    # The model names what it needs to load, pinned to what trained it (not everything the process imported).
    mlflow.set_tracking_uri(demo["tracking_uri"])
    requirements = Path(mlflow.pyfunc.get_model_dependencies(f"models:/{demo['model_name']}/1")).read_text()
    assert requirements.split() == model_requirements()
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements.split()  # installable from PyPI
    assert "lightning" not in requirements and "transformers" not in requirements


def test_identical_retrain_is_registered_but_not_promoted(demo, tp_home):
    proc = run_tp(tp_home, "train", "examples/digits.yaml", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = last_json(proc)
    # Same seed and snapshot on CPU: bitwise the same weights, so the gate (strictly better) refuses.
    assert again["final_weights_sha256"] == demo["final_weights_sha256"]
    assert again["model_version"] == "2"
    assert again["promoted"] is False
    client = MlflowClient(tracking_uri=demo["tracking_uri"])
    assert str(client.get_model_version_by_alias(demo["model_name"], CHAMPION_ALIAS).version) == "1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "blue"}, "colour: unknown field"),
        ({"resources": {"procs_per_node": 0}}, "resources.procs_per_node"),
        ({"strategy": "horovod"}, "strategy: unknown strategy"),
        ({"dataset": {"snapshot_id": "ab" * 32}}, "dataset.snapshot_id: snapshot"),
        ({"checkpoint": {"store_uri": "/etc/hostname/checkpoints"}}, "checkpoint.store_uri: cannot write"),
        ({"resources": {"gpus_per_node": 2, "procs_per_node": 2}}, "gpus_per_node"),
    ],
)
def test_bad_input_is_refused_before_launch_with_exit_code_2(tp_home, tmp_path, change, message):
    spec = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    for key, value in change.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and key in spec else value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    runs_before = set((tp_home / "runs").glob("*"))
    proc = run_tp(tp_home, "train", str(path), "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert last_json(proc)["status"] == "REFUSED"
    assert set((tp_home / "runs").glob("*")) == runs_before


def test_doctor_reports_a_healthy_environment(tp_home):
    proc = run_tp(tp_home, "doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = last_json(proc)
    assert report["ok"] is True
    assert {"python", "torch", "devices", "mlflow", "dagster_home"} <= set(report["checks"])


def test_definitions_load():
    from definitions import defs

    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    chain = ["dataset_snapshot", "training_run", "checkpoints", "evaluated_model", "registered_model"]
    assert set(chain) <= {key.to_user_string() for key in graph.get_all_asset_keys()}
    for upstream, downstream in zip(chain, chain[1:], strict=False):  # the lineage reads left to right
        assert dg.AssetKey(upstream) in graph.get(dg.AssetKey(downstream)).parent_keys
