"""The hourly schedule releases a queued sweep only inside its cost window; the shipped instance config loads."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml

from sensors.sweep_windows import run_window_schedule, sweep_window_schedule
from training_platform.cost.run_windows import RunWindowQueue, run_window
from training_platform.cost.run_windows import waits_for_window as run_waits_for_window
from training_platform.spec import parse_spec
from training_platform.sweeps import SweepQueue, parse_sweep
from training_platform.sweeps.queue import sweep_window, waits_for_window

ROOT = Path(__file__).resolve().parents[3]
MONDAY_PEAK = datetime(2026, 11, 23, 14, tzinfo=UTC)  # Monday 14:00 UTC: US business hours, dear spot


def gpu_sweep(deadline: datetime):
    return parse_sweep({
        "name": "gpu-sweep",
        "deadline": deadline.isoformat(),
        "base": {"name": "llm", "team": "nlp", "owner": "me", "cost": {"expected_hours": 2},
                 "resources": {"procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100", "spot": True,
                               "priority": "high"}},
        "search_space": {"training.learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        "limits": {"max_trials": 8, "parallel_trials": 4},
    })


def test_window_is_after_peak_and_saves_money():
    window = sweep_window(gpu_sweep(MONDAY_PEAK + timedelta(days=2)), now=MONDAY_PEAK)
    assert window.start > MONDAY_PEAK and window.end <= MONDAY_PEAK + timedelta(days=2)
    assert window.gpus == 32 and window.gpu_hours == 2 * 2 * 32  # 2 waves of 4 trials x 2 h on 32 GPUs
    assert window.saving > 0


def test_only_a_sweep_with_a_deadline_waits_for_its_window():
    with_deadline = gpu_sweep(MONDAY_PEAK + timedelta(days=2))
    window = sweep_window(with_deadline, now=MONDAY_PEAK)
    assert waits_for_window(with_deadline, window, MONDAY_PEAK)
    assert not waits_for_window(with_deadline, window, window.start)  # the window has opened
    without = with_deadline.model_copy(update={"deadline": None})
    assert not waits_for_window(without, sweep_window(without, now=MONDAY_PEAK), MONDAY_PEAK)


def test_schedule_releases_only_inside_the_window(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_HOME", str(tmp_path))
    sweep = gpu_sweep(MONDAY_PEAK + timedelta(days=2))
    queued = SweepQueue(tmp_path).enqueue(sweep, sweep_window(sweep, now=MONDAY_PEAK))

    an_hour_early = queued.start - timedelta(hours=1)
    before = sweep_window_schedule(dg.build_schedule_context(scheduled_execution_time=an_hour_early))
    assert isinstance(before, dg.SkipReason) and "gpu-sweep at" in before.skip_message

    inside = sweep_window_schedule(dg.build_schedule_context(scheduled_execution_time=queued.start))
    assert len(inside) == 1
    request = inside[0]
    assert request.partition_key == "gpu-sweep"
    assert request.tags["team"] == "nlp" and request.tags["dagster/priority"] == "10"
    assert float(request.tags["window_saving_usd"]) == pytest.approx(queued.window["saving"])
    assert request.run_key == f"gpu-sweep@{queued.window['start']}"  # a second tick does not start it twice


def test_shipped_instance_config_queues_runs_with_per_team_limits(tmp_path, monkeypatch):
    config = yaml.safe_load((ROOT / "deploy" / "dagster" / "dagster.yaml").read_text())
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)
        queue = instance.get_concurrency_config().run_queue_config
        team = next(rule for rule in queue.tag_concurrency_limits if rule["key"] == "team")
        assert team["value"] == {"applyLimitPerUniqueValue": True}
        # Three teams at their limits fit in the global cap: no team can take every slot.
        assert 3 * team["limit"] <= queue.max_concurrent_runs


def gpu_run(deadline: datetime | None):
    return parse_spec({
        "name": "llm", "team": "nlp", "owner": "me",
        "cost": {"expected_hours": 3, "deadline": deadline.isoformat() if deadline else None},
        "resources": {"procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100", "spot": True},
    })


def test_a_run_with_a_deadline_waits_for_its_cheapest_window():
    window = run_window(gpu_run(MONDAY_PEAK + timedelta(days=2)), now=MONDAY_PEAK)
    assert window.start > MONDAY_PEAK and window.end <= MONDAY_PEAK + timedelta(days=2)
    assert window.gpu_hours == 3 * 8 and window.saving > 0
    assert run_waits_for_window(window, MONDAY_PEAK) and not run_waits_for_window(window, window.start)
    assert run_window(gpu_run(None), now=MONDAY_PEAK) is None and not run_waits_for_window(None, MONDAY_PEAK)


def test_the_schedule_submits_a_waiting_run_once_in_its_window(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_HOME", str(tmp_path))
    spec = gpu_run(MONDAY_PEAK + timedelta(days=2))
    waiting = RunWindowQueue(tmp_path).enqueue("llm-1", spec, {"team": "nlp"}, run_window(spec, now=MONDAY_PEAK))
    with dg.instance_for_test() as instance:
        early = run_window_schedule(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=waiting.start - timedelta(hours=1))
        )
        assert isinstance(early, dg.SkipReason) and "llm-1 at" in early.skip_message

        (request,) = run_window_schedule(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=waiting.start)
        )
        assert request.partition_key == "llm-1" and request.tags["team"] == "nlp"
        assert parse_spec(json.loads(request.run_config["ops"]["training_run"]["config"]["spec"])) == spec

        # Released: a run with its partition and window exists, so the next hour's tick does not submit it again.
        instance.create_run_for_job(
            dg.GraphDefinition("placeholder").to_job(), tags={**request.tags, "dagster/partition": "llm-1"}
        )
        later = run_window_schedule(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=waiting.start + timedelta(hours=1))
        )
        assert isinstance(later, dg.SkipReason)
