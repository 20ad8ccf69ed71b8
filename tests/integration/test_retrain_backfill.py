"""`tp retrain`: a Dagster backfill of days on the worker's shared platform server, each day's snapshot checked by
its expectations, trained and gated against the champion; `tp snapshots` says why a day's drop may not train.

On the shared server, other modules' runs, snapshots and backfills are there too: this one reads its own (its
model's name, the daily source's snapshots, the backfills it started)."""

from __future__ import annotations

import json

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.fixtures.platform import ROOT, Platform, server_logs
from tests.fixtures.worker import wait_until
from training_platform.datasets.daily import default_landing

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_backfill_of_three_days_builds_three_models_with_distinct_lineage(platform, tmp_path):
    spec = yaml.safe_load((ROOT / "examples" / "digits-daily.yaml").read_text())
    spec["name"] = "tiny-daily"
    spec["training"].update(max_steps=20, eval_every=10, log_every=5)
    spec["resources"]["procs_per_node"] = 1
    spec["checkpoint"] = {"every_steps": 10, "keep_last": 1}
    spec_path = tmp_path / "tiny-daily.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    with platform.instance() as instance:
        backfills_before = {b.backfill_id for b in instance.get_backfills()}
    proc = platform.tp("retrain", "--from", "2026-11-02", "--to", "2026-11-04", "--spec", str(spec_path), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(platform.home)
    again = platform.tp("retrain", "--from", "2026-11-03", "--to", "2026-11-04", "--spec", str(spec_path), "--json")
    with platform.instance() as instance:
        backfills = [b.backfill_id for b in instance.get_backfills() if b.backfill_id not in backfills_before]
    # A fourth day whose drop has a label that is no digit: its snapshot fails, and `tp snapshots` says why.
    landing = default_landing(platform.home)
    table = pq.read_table(landing / "2026-11-04.parquet")
    labels = table.column("label").to_numpy().copy()
    labels[3] = 11
    pq.write_table(
        table.set_column(table.schema.get_field_index("label"), "label", [labels]), landing / "2026-11-05.parquet"
    )
    bad_day = platform.tp("retrain", "--from", "2026-11-05", "--to", "2026-11-05", "--spec", str(spec_path))
    listed = platform.tp("snapshots", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    every_snapshot = json.loads(listed.stdout.strip().splitlines()[-1])["snapshots"]
    snapshots = [s for s in every_snapshot if s["source"] == "digits_daily"]  # newest first, as listed
    failed = platform.tp("snapshots", "show", snapshots[0]["snapshot_id"][:12])
    passed = platform.tp("snapshots", "show", snapshots[1]["snapshot_id"], "--json")
    # The server's registry (its environment has no MLFLOW_TRACKING_URI: the home's), not this process's.
    registry = MlflowClient(tracking_uri=f"sqlite:///{platform.home / 'mlflow.db'}")
    gates = [registry.get_model_version("tiny-daily", str(n)).tags["gate"] for n in (1, 2, 3)]
    # The server's new-data sensor may have seen a drop before `tp retrain` built it, and asked for its snapshot:
    # that run ends here, not in the next module's test.
    wait_until(lambda: not _snapshot_runs_of_drops_in_flight(platform), 300, "the new-data sensor's runs to end")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    days = report["days"]
    assert [d["run_id"] for d in days] == [f"tiny-daily-2026-11-0{n}" for n in (2, 3, 4)]
    assert [d["status"] for d in days] == ["SUCCEEDED"] * 3
    assert [d["model_version"] for d in days] == ["1", "2", "3"]  # the days trained one after the other
    assert len({d["lineage_key"] for d in days}) == 3
    assert len({d["snapshot_id"] for d in days}) == 3
    assert days[0]["promoted"] is True  # the first model has no champion to beat
    # Each later day's gate measured the champion again on that day's test split, and says so.
    assert gates[0] == "no champion yet"
    for day, gate in zip(days[1:], gates[1:], strict=True):
        assert f"both on the test split of snapshot {day['snapshot_id'][:12]} (champion v" in gate, gate
        assert gate.endswith("measured again on it)"), gate
    assert [d["lineage"]["snapshot_id"] for d in days] == [d["snapshot_id"] for d in days]
    for day in days:  # one line per day on the console
        assert f"{day['day']}  {day['run_id']}  model v{day['model_version']}" in proc.stderr
    # It was one Dagster backfill; days trained before are not trained again (and start no second backfill).
    assert backfills == [report["backfill_id"]]
    assert again.returncode == 0, again.stderr[-3000:]
    repeat = json.loads(again.stdout.strip().splitlines()[-1])
    assert [d["status"] for d in repeat["days"]] == ["EXISTS", "EXISTS"]
    assert [d["model_version"] for d in repeat["days"]] == ["2", "3"]

    # tp snapshots: the four days' snapshots, the newest (the bad drop's) first, and why it may not train.
    assert (snapshots[0]["days"], snapshots[0]["expectations"]) == (["2026-11-05"], "FAILED"), bad_day.stderr[-3000:]
    built = sorted((s["days"], s["snapshot_id"], s["expectations"]) for s in snapshots[1:])
    assert built == [([d["day"]], d["snapshot_id"], "passed") for d in days]
    assert all(s["rows"] == sum(s["splits"].values()) > 0 for s in snapshots)
    assert failed.returncode == 0, failed.stderr[-3000:]
    # Each failed expectation on one line: what it checks, which expectation, its counts and examples.
    line = next((row for row in failed.stderr.splitlines() if "label in 0..9" in row), "")
    assert "expect_column_values_to_be_in_set(label)" in line and '"unexpected_count": 1' in line, failed.stderr
    assert '"partial_unexpected_list": [11]' in line, line
    shown = json.loads(passed.stdout.strip().splitlines()[-1])
    assert shown["snapshot_id"] == days[-1]["snapshot_id"] and shown["expectations"] == "passed"
    assert shown["check"]["failed"] == [] and shown["check"]["expectations"] > 5
    assert {"row_id", "label"} <= set(shown["schema"]), shown["schema"]


def _snapshot_runs_of_drops_in_flight(platform: Platform) -> bool:
    unfinished = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
                                         dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED])
    with platform.instance() as instance:
        return any("tp/drop" in run.tags for run in instance.get_runs(unfinished))
