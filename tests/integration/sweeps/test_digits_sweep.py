"""A real sweep through `tp sweep`: 8 digits trials, ASHA pruning, the local launcher, Dagster, MLflow, Optuna.

Each trial is one process (procs_per_node: 1) and two trials run at once: two cores, two trials.
"""

import json
import os
from pathlib import Path

import dagster as dg
import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import ROOT, last_json, server_logs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
EXAMPLE = ROOT / "examples" / "digits-sweep.yaml"
TRIALS = 8  # enough for TPE past its 4 random trials and for ASHA to prune


@pytest.fixture(scope="module")
def sweep_run(platform):
    home = platform.home
    data = yaml.safe_load(EXAMPLE.read_text())
    data["base"]["name"] = "sweep-digits"  # its trials' model, not the demo's digits-classifier (a shared server)
    data["base"]["training"]["max_steps"] = 60
    data["limits"] = {"max_trials": TRIALS, "parallel_trials": 2}
    path = home / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = platform.tp("sweep", str(path), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(home)
    return home, last_json(proc)


def test_sweep_runs_every_trial_and_prunes_some(sweep_run):
    home, summary = sweep_run
    assert summary["status"] == "SUCCEEDED"
    assert summary["trials"] == TRIALS and summary["fail"] == 0
    assert summary["pruned"] >= 1 and summary["complete"] >= 1
    assert summary["total_steps"] < TRIALS * 60  # pruning saved steps
    study = optuna.load_study(study_name="digits-lr-sweep", storage=summary["storage"])
    assert len(study.trials) == TRIALS
    for row in summary["trial_table"]:
        assert study.trials[row["number"]].state.name == row["state"]


def test_pruned_trials_are_marked_pruned_with_a_checkpoint_not_failed(sweep_run):
    home, summary = sweep_run
    pruned = [row for row in summary["trial_table"] if row["state"] == "PRUNED"]
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    try:
        with dg.DagsterInstance.get() as instance:
            for row in pruned:
                run_dir = home / "runs" / row["run_id"]
                result = json.loads((run_dir / "result.json").read_text())
                assert result["status"] == "PRUNED" and result["final_step"] == row["steps"] < 60
                # The checkpoint at the pruning step is in the store (data first, manifest last).
                assert result["checkpoints"][-1]["step"] == row["steps"]
                assert Path(result["checkpoints"][-1]["uri"]).is_file()
                event = instance.get_latest_materialization_event(dg.AssetKey("training_run"))
                records = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=dg.AssetKey("training_run"), asset_partitions=[row["run_id"]]),
                    limit=1,
                ).records
                assert event is not None and records, row["run_id"]
                metadata = records[0].asset_materialization.metadata
                assert metadata["status"].value == "PRUNED"
                assert metadata["cost_total_usd"].value > 0
                run = instance.get_run_by_id(records[0].run_id)
                assert run.status == dg.DagsterRunStatus.SUCCESS  # pruned is not failed
                assert run.tags["team"] == "ml-platform" and run.tags["sweep"] == "digits-lr-sweep"
    finally:
        del os.environ["DAGSTER_HOME"]


def test_best_trial_spec_is_reported(sweep_run):
    home, summary = sweep_run
    complete = [r for r in summary["trial_table"] if r["state"] == "COMPLETE"]
    best = max(complete, key=lambda r: r["value"])
    assert summary["best_run_id"] == best["run_id"] and summary["best_value"] == best["value"]
    submitted = json.loads((home / "runs" / best["run_id"] / "submitted_spec.json").read_text())
    reported = summary["best_spec"]
    assert reported["training"] == submitted["training"]
    assert reported["training"]["learning_rate"] == summary["best_params"]["training.learning_rate"]
    assert reported["training"]["batch_size"] == summary["best_params"]["training.batch_size"]


def test_trials_nest_under_the_sweep_mlflow_run_and_costs_add_up(sweep_run, platform):
    home, summary = sweep_run
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    parent = client.get_run(summary["parent_mlflow_run_id"])
    assert parent.data.tags["sweep"] == "digits-lr-sweep" and parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert len(children) == TRIALS
    report = last_json(platform.tp("cost", "report", "--by", "sweep", "--json"))
    row = report["totals"]["digits-lr-sweep"]
    assert row["runs"] == TRIALS
    assert row["total_usd"] > 0 and row["accelerator_hours"] > 0
