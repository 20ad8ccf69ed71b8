"""`tp doctor --bench`: real measurements of the store, a 2-process gloo all-reduce and snapshot reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training_platform.datasets import build_snapshot
from training_platform.spec import parse_spec
from training_platform.telemetry.bench import checkpoint_write, full_checkpoint_bytes

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
TP = str(Path(sys.executable).with_name("tp"))


def test_doctor_bench_reports_each_figure_with_a_verdict(tmp_path):
    build_snapshot("sklearn_digits", tmp_path / "snapshots")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI")}
    env["TP_HOME"] = str(tmp_path)
    proc = subprocess.run(
        [TP, "doctor", "--bench", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = {b["name"]: b for b in json.loads(proc.stdout.strip().splitlines()[-1])["bench"]}
    assert set(bench) == {"checkpoint_write", "allreduce_busbw", "data_read", "gpu_topology"}
    write = bench["checkpoint_write"]
    assert write["value"] > 0 and write["unit"] == "MB/s" and write["ok"]
    assert "a full checkpoint of this spec" in write["verdict"] and "budget 10 s" in write["verdict"]
    allreduce = bench["allreduce_busbw"]
    assert allreduce["value"] > 0 and "2 gloo processes" in allreduce["verdict"]
    assert bench["data_read"]["value"] > 0 and bench["data_read"]["ok"]
    # The probe leaves nothing behind in the store.
    assert not list((tmp_path / "checkpoints").glob("runs/doctor-bench-*"))
    assert "Traceback" not in proc.stderr


def test_checkpoint_verdict_says_no_when_the_budget_cannot_be_met(tmp_path):
    spec = parse_spec({"name": "big", "team": "t", "owner": "o", "model": {"size": "base"}})
    size = full_checkpoint_bytes(spec)
    assert size > 0
    result = checkpoint_write(str(tmp_path / "store"), size, budget_s=1e-6)
    assert not result.ok and result.verdict.startswith("NO:") and "async saving" in result.verdict
    assert list((tmp_path / "store").rglob("*.json")) == []
