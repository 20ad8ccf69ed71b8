"""Budgets are checked at submission: over budget is refused (exit 2) and nothing is queued or launched."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
TP = str(Path(sys.executable).with_name("tp"))


def run_tp(home: Path, *args: str) -> subprocess.CompletedProcess:
    # The home's own teams file (teams.yaml), which holds the budgets, not the tests' shared one.
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "TP_TEAMS")}
    env["TP_HOME"] = str(home)
    return subprocess.run([TP, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def nothing_queued(home: Path) -> None:
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    assert not (home / "sweeps" / "queue").exists()
    assert not (home / "sweeps.db").exists()
    runs_db = home / "dagster" / "history" / "runs.db"
    if runs_db.exists():  # no Dagster run, no partition
        import sqlite3

        with sqlite3.connect(runs_db) as db:
            assert db.execute("select count(*) from runs").fetchone()[0] == 0


def test_sweep_over_budget_is_refused_before_anything_is_queued(tmp_path):
    (tmp_path / "teams.yaml").write_text("teams:\n  ml-platform: {monthly_usd: 1}\n")
    proc = run_tp(tmp_path, "sweep", str(ROOT / "examples" / "digits-sweep.yaml"), "--json")  # max_usd: 5
    assert proc.returncode == 2, proc.stderr[-2000:]
    refusal = json.loads(proc.stdout.strip().splitlines()[-1])
    assert refusal["status"] == "REFUSED"
    assert "'ml-platform'" in refusal["error"] and "$1.00" in refusal["error"] and "$0.00" in refusal["error"]
    assert "Traceback" not in proc.stderr
    nothing_queued(tmp_path)


def test_train_over_budget_is_refused_naming_team_budget_and_spend(tmp_path):
    (tmp_path / "teams.yaml").write_text("teams:\n  ml-platform: {monthly_usd: 10}\n")
    (tmp_path / "cost").mkdir()
    from datetime import UTC, datetime

    spent = {"run_id": "earlier", "team": "ml-platform", "sweep": None, "at": datetime.now(UTC).isoformat(),
             "capacity": "on_demand", "gpu_type": "H100", "accelerator_hours": 2.0, "compute_usd": 13.76,
             "storage_gb_months": 0, "storage_usd": 0, "transfer_gb": 0, "transfer_usd": 0, "lost_hours": 0,
             "lost_work_usd": 0, "total_usd": 13.76, "extra": {}}
    (tmp_path / "cost" / "ledger.jsonl").write_text(json.dumps(spent) + "\n")
    proc = run_tp(tmp_path, "train", str(ROOT / "examples" / "digits.yaml"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'ml-platform' is over its monthly budget: spent $13.76 of $10.00" in " ".join(proc.stderr.split())
    nothing_queued(tmp_path)
