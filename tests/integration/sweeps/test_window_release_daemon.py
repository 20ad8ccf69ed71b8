"""The real Dagster daemon releases a queued sweep once its cost window opens, and only then.

Two sweeps wait in the queue: one whose window opened a minute ago, one whose window opens in three
hours. The release schedule ticks every minute here (TP_SWEEP_RELEASE_CRON), instead of hourly.
"""

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from tests.fixtures.dagster_daemon import daemon_log_tail, running_daemon
from tests.fixtures.worker import wait_until
from training_platform.cost.windows import CostWindow
from training_platform.datasets import build_snapshot
from training_platform.sweeps import SweepQueue, parse_sweep

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
DEFINITIONS = Path(__file__).resolve().parents[3] / "definitions.py"
RELEASED_BY_SCHEDULE = {"dagster/schedule_name": "sweep_window_schedule"}


def tiny_sweep(name: str, snapshot_id: str, deadline: datetime):
    return parse_sweep({
        "name": name,
        "deadline": deadline.isoformat(),
        "base": {"name": "digits", "team": "vision", "owner": "ci", "dataset": {"snapshot_id": snapshot_id},
                 "training": {"max_steps": 20, "eval_every": 10, "log_every": 10},
                 "resources": {"procs_per_node": 1, "spot": True, "priority": "low"},
                 "checkpoint": {"every_steps": 10}},
        "search_space": {"training.learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "limits": {"max_trials": 1, "parallel_trials": 1},
    })


def window(start: datetime) -> CostWindow:
    return CostWindow(start=start, end=start + timedelta(minutes=30), expected_cost=0.01, cost_if_now=0.02,
                      gpu_hours=0.5, gpus=1, gpu_type=None, spot=True, region="us-east-1")


def test_the_daemon_releases_a_sweep_in_its_window_and_keeps_a_later_one_waiting(tmp_path):
    home = tmp_path / "tp"
    snapshot = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
    now = datetime.now(UTC)
    queue = SweepQueue(home)
    queue.enqueue(tiny_sweep("open-window", snapshot, now + timedelta(hours=4)), window(now - timedelta(minutes=1)))
    queue.enqueue(tiny_sweep("later-window", snapshot, now + timedelta(hours=8)), window(now + timedelta(hours=3)))

    env = {"TP_HOME": str(home), "TP_SWEEP_RELEASE_CRON": "* * * * *"}
    with running_daemon(tmp_path, DEFINITIONS, env), dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("sweeps", ["open-window", "later-window"])
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            runs = instance.get_runs(dg.RunsFilter(tags=RELEASED_BY_SCHEDULE | {"sweep": "open-window"}))
            if runs and runs[0].is_finished:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the sweep was not released and finished in time; daemon log:\n{daemon_log_tail(tmp_path)}")
        run = runs[0]
        assert run.status == dg.DagsterRunStatus.SUCCESS, daemon_log_tail(tmp_path)
        assert run.tags["dagster/partition"] == "open-window" and run.tags["team"] == "vision"
        assert run.tags["window_start"] == (now - timedelta(minutes=1)).isoformat()
        assert float(run.tags["window_saving_usd"]) == pytest.approx(0.01)
        assert not instance.get_runs(dg.RunsFilter(tags={"sweep": "later-window"}))
        materialization = instance.get_latest_materialization_event(dg.AssetKey("sweep"))
        assert materialization is not None and materialization.asset_materialization.partition == "open-window"
        # Released, the sweep's trials run as queued training runs until the sweep sensor records it finished.
        wait_until(lambda: queue.get("open-window").state == "FINISHED", 420,
                   f"the released sweep to finish; daemon log:\n{daemon_log_tail(tmp_path)}")
        trials = instance.get_runs(dg.RunsFilter(tags={"sweep": "open-window"}, job_name="training_pipeline"))
        assert [r.status for r in trials] == [dg.DagsterRunStatus.SUCCESS]
        assert all(r.tags["team"] == "vision" and r.tags["dagster/priority"] == "-10" for r in trials)

    assert queue.get("later-window").state == "QUEUED"
