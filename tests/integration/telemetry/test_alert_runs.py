"""Alert rules on real short runs of the worker under torchrun: a healthy run stays quiet,
a sleep-heavy run with an artificially slow data loader fires the data-wait and utilization
alerts, and a run that checkpoints every step fires the checkpoint-overhead alert."""

import json
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.paths import PlatformHome
from training_platform.spec import parse_spec
from training_platform.telemetry.alerts import AlertThresholds, evaluate_run
from training_platform.telemetry.records import load_run_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# Seconds instead of the production 10 minutes; samples every 0.1 s so the window holds many.
THRESHOLDS = AlertThresholds(utilization_window_s=2.0)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


def train(home: Path, run_id: str, max_steps: int, every_steps: int, env: dict[str, str]) -> dict:
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = parse_spec(
        {
            "name": "telemetry",
            "team": "qa",
            "owner": "ci",
            "model": {"size": "tiny"},
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": max_steps, "batch_size": 32, "eval_every": 50, "log_every": 10},
            "resources": {"procs_per_node": 1},
            "checkpoint": {
                "every_steps": every_steps,
                "keep_last": 2,
                "store_uri": str(home / "checkpoints"),
                # synchronous saves: the overhead the alert exists to catch
                "async_save": False,
            },
        }
    )
    run_dir = home / "runs" / run_id
    request = RunRequest(
        spec=spec,
        run_id=run_id,
        run_dir=run_dir,
        env={"TP_HOME": str(home), "TP_TELEMETRY_INTERVAL_S": "0.1", "TP_SLOW_DATA_SECONDS": "0", **env},
    )
    request.write_spec()
    (run_dir / "submitted_spec.json").write_text(spec.model_dump_json())
    launcher = LocalLauncher(visible_gpus=0)
    handle = launcher.submit(launcher.plan(request))
    deadline = time.monotonic() + 240
    while not (status := launcher.status(handle)).state.finished:
        assert time.monotonic() < deadline, (run_dir / LOG_FILE).read_text()[-2000:]
        time.sleep(0.2)
    assert status.state == JobState.SUCCEEDED, (run_dir / LOG_FILE).read_text()[-3000:]
    return json.loads((run_dir / "telemetry.json").read_text())


@pytest.fixture(scope="module")
def healthy(home) -> dict:
    return train(home, "healthy", max_steps=400, every_steps=1000, env={})


@pytest.fixture(scope="module")
def slow_data(home) -> dict:
    # 200 ms of sleep in every batch fetch: a loader that cannot keep up, a device that waits.
    return train(home, "slow-data", max_steps=40, every_steps=1000, env={"TP_SLOW_DATA_SECONDS": "0.2"})


@pytest.fixture(scope="module")
def checkpoint_heavy(home) -> dict:
    return train(home, "checkpoint-heavy", max_steps=40, every_steps=1, env={})


def alerts_of(home: Path, run_id: str) -> dict:
    record = load_run_record(PlatformHome(home), run_id)
    return evaluate_run(record, [], THRESHOLDS, time.time())


def test_worker_writes_figures_samples_and_plots(home, healthy):
    assert healthy["status"] == "SUCCEEDED" and healthy["step"] == 400
    figures = healthy["figures"]
    assert figures["steps"] == 400 and figures["samples_per_s"] > 0 and figures["step_time_s"] > 0
    assert figures["cost_usd"] > 0 and figures["peak_memory_mb"] > 0
    assert healthy["device"] == "cpu" and len(healthy["utilization"]) >= 3
    for name in ("loss_curve.png", "utilization.png", "cost.png"):
        with Image.open(home / "runs" / "healthy" / "plots" / name) as image:
            assert image.format == "PNG"


def test_a_healthy_run_raises_no_data_or_utilization_alert(home, healthy):
    alerts = alerts_of(home, "healthy")
    assert alerts["data_wait"] is None, healthy["figures"]
    assert alerts["low_utilization"] is None, healthy["utilization"]
    assert healthy["figures"]["utilization_pct"] > 50


def test_slow_data_fires_the_data_wait_alert(home, slow_data):
    alert = alerts_of(home, "slow-data")["data_wait"]
    assert alert is not None, slow_data["figures"]
    assert alert.run_id == "slow-data" and alert.value > 0.3
    assert "waited for data" in alert.what and "data loader" in alert.look_at


def test_a_sleep_heavy_loop_fires_the_utilization_alert(home, slow_data):
    alert = alerts_of(home, "slow-data")["low_utilization"]
    assert alert is not None, slow_data["utilization"]
    assert alert.value < THRESHOLDS.utilization_min_pct
    assert slow_data["figures"]["utilization_pct"] < 50


def test_checkpointing_every_step_fires_the_overhead_alert(home, checkpoint_heavy, slow_data):
    alert = alerts_of(home, "checkpoint-heavy")["checkpoint_overhead"]
    assert alert is not None, checkpoint_heavy["figures"]
    assert "checkpoint.every_steps" in alert.look_at
    # One final checkpoint of a tiny model over an 8 s loop stays under 2%.
    assert alerts_of(home, "slow-data")["checkpoint_overhead"] is None, slow_data["figures"]


def test_cost_so_far_follows_the_run_wall_time(home, healthy, slow_data, checkpoint_heavy):
    for run_id in ("healthy", "slow-data", "checkpoint-heavy"):
        record = load_run_record(PlatformHome(home), run_id)
        hours = (record.ended_at - record.started_at) / 3600
        # One CPU process at the price table's rate: cost = rate x hours (up to the last sample's rounding).
        assert record.cost_usd == pytest.approx(record.cost_per_hour_usd * hours, rel=0.05, abs=2e-6), run_id


def test_telemetry_interval_is_honoured(healthy):
    times = [t for t, _ in healthy["utilization"]]
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    assert gaps and 0.05 < gaps[len(gaps) // 2] < 0.5, gaps
    assert os.environ.get("TP_TELEMETRY_INTERVAL_S") is None  # the setting travelled in the run's env only
