"""Each alert rule fires on a run record that breaks it and stays quiet on one that does not."""

import pytest

from training_platform.telemetry.alerts import (
    AlertThresholds,
    checkpoint_overhead,
    cost_outlier,
    data_wait,
    evaluate_live,
    evaluate_run,
    failure_rates,
    low_utilization,
    queue_wait,
    spend_spikes,
)
from training_platform.telemetry.records import RunRecord

TH = AlertThresholds()
HOUR = 3600.0


def samples(values: list[float], every_s: float = 60.0) -> tuple[tuple[float, float], ...]:
    return tuple((1000.0 + i * every_s, v) for i, v in enumerate(values))


def test_low_utilization_needs_a_whole_window_below_the_floor():
    idle = RunRecord("idle", device="gpu", utilization=samples([90] + [30] * 11 + [90]))  # 10 min at 30%
    assert (alert := low_utilization(idle, TH)) is not None
    assert alert.run_id == "idle" and "GPU utilization averaged 30% over 600 s" in alert.what
    assert alert.value == 30 and "utilization plot" in alert.look_at
    short_dip = RunRecord("dip", utilization=samples([90] * 5 + [10] * 5 + [90] * 5))  # only 5 min low
    assert low_utilization(short_dip, TH) is None
    busy = RunRecord("busy", utilization=samples([95] * 30))
    assert low_utilization(busy, TH) is None
    too_short = RunRecord("short", utilization=samples([5] * 5))  # the run is shorter than the window
    assert low_utilization(too_short, TH) is None


def test_low_utilization_judges_the_window_mean_not_single_samples():
    # Bursty but idle on average (steps between long waits): single samples jump above the floor.
    bursty_idle = RunRecord("bursty", utilization=samples([80, 5, 10, 5] * 6))
    assert low_utilization(bursty_idle, TH) is not None
    # Busy on average with short dips (a checkpoint, an eval): quiet.
    busy_with_dips = RunRecord("dips", utilization=samples([20, 95, 95] * 8))
    assert low_utilization(busy_with_dips, TH) is None


def test_low_utilization_window_is_configurable():
    short = AlertThresholds(utilization_window_s=2.0)
    run = RunRecord("r", utilization=samples([10, 10, 10], every_s=1.0))
    assert low_utilization(run, short) is not None
    assert low_utilization(run, TH) is None


@pytest.mark.parametrize(("fraction", "fires"), [(0.25, True), (0.10, False), (0.02, False), (None, False)])
def test_data_wait(fraction, fires):
    alert = data_wait(RunRecord("r", data_wait_fraction=fraction), TH)
    assert (alert is not None) == fires
    if fires:
        assert "25% of the training loop waited for data" in alert.what and "data loader" in alert.look_at


@pytest.mark.parametrize(("overhead", "fires"), [(0.05, True), (0.02, False), (0.001, False)])
def test_checkpoint_overhead(overhead, fires):
    alert = checkpoint_overhead(RunRecord("r", checkpoint_overhead=overhead), TH)
    assert (alert is not None) == fires
    if fires:
        assert "checkpoint.every_steps" in alert.look_at


def test_queue_wait_for_started_and_still_queued_runs():
    started_late = RunRecord("late", queued_at=0.0, started_at=3 * HOUR, team="vision")
    assert "before it started" in queue_wait(started_late, TH, now=4 * HOUR).what
    assert "--team vision" in queue_wait(started_late, TH, now=4 * HOUR).look_at
    started_soon = RunRecord("soon", queued_at=0.0, started_at=60.0)
    assert queue_wait(started_soon, TH, now=10 * HOUR) is None
    waiting = RunRecord("waiting", status="QUEUED", queued_at=0.0)
    assert queue_wait(waiting, TH, now=1 * HOUR) is None
    assert "still queued" in queue_wait(waiting, TH, now=2.5 * HOUR).what
    failed_before_start = RunRecord("never", status="FAILED", queued_at=0.0)
    assert queue_wait(failed_before_start, TH, now=5 * HOUR) is None


DAY = 24 * HOUR
NOW = 10 * DAY


def _finished(n_ok: int, n_failed: int, team: str = "vision", ended: float = NOW - HOUR) -> list[RunRecord]:
    runs = [RunRecord(f"{team}-ok-{i}", team=team, status="SUCCEEDED", ended_at=ended + i) for i in range(n_ok)]
    failed = range(n_failed)
    runs += [RunRecord(f"{team}-bad-{i}", team=team, status="FAILED", ended_at=ended + 100 + i) for i in failed]
    return runs


def test_failure_rate_per_team_over_a_day():
    (alert,) = failure_rates(_finished(18, 2) + _finished(30, 0, team="nlp"), TH, NOW)  # 10% > 5%; nlp clean
    assert alert.severity == "ERROR" and alert.team == "vision"
    assert "2 of its 20 runs of the last 24 h failed" in alert.what and "vision-bad-1" in alert.look_at
    assert alert.text().startswith("[failure_rate] team vision: ")
    assert failure_rates(_finished(19, 1), TH, NOW) == []  # exactly 5% is allowed
    assert failure_rates(_finished(5, 3), TH, NOW) == []  # too few runs to judge
    # Yesterday's failures do not count today.
    assert failure_rates(_finished(0, 5, ended=NOW - 2 * DAY) + _finished(20, 0), TH, NOW) == []


def test_a_team_rule_is_debounced_per_period_and_a_run_rule_per_run():
    (today,) = failure_rates(_finished(18, 2), TH, NOW)
    (later_today,) = failure_rates(_finished(18, 2), TH, NOW + HOUR)
    (tomorrow,) = failure_rates(_finished(18, 2, ended=NOW + DAY - HOUR), TH, NOW + DAY)
    assert today.key == later_today.key != tomorrow.key
    idle = RunRecord("idle", utilization=samples([5] * 12))
    assert low_utilization(idle, TH).key == "low_utilization:idle"


def _spend(team: str, hourly: list[float], last_hour: float) -> list[tuple[str, float, float]]:
    """One ledger record per trailing hour (oldest first), then one in the last hour."""
    start = NOW - HOUR - len(hourly) * HOUR
    items = [(team, start + (i + 0.5) * HOUR, usd) for i, usd in enumerate(hourly)]
    return items + [(team, NOW - HOUR / 2, last_hour)]


def test_spend_spike_against_the_trailing_hourly_mean():
    (alert,) = spend_spikes(_spend("nlp", [1.0] * 24, 2.5) + _spend("vision", [1.0] * 24, 1.5), TH, NOW)
    assert alert.team == "nlp" and alert.rule == "spend_spike" and alert.value == pytest.approx(2.5)
    assert "spent $2.50 in the last hour, 2.5x its mean $1.00" in alert.what
    assert spend_spikes(_spend("nlp", [1.0] * 24, 2.0), TH, NOW) == []  # exactly 2x is allowed
    assert spend_spikes(_spend("nlp", [0.0] * 22 + [1.0] * 2, 50.0), TH, NOW) == []  # too little history
    # Idle hours count in the mean: 4 busy hours of a quiet day make a mean of $0.50.
    (quiet_day,) = spend_spikes(_spend("nlp", [0.0] * 20 + [3.0] * 4, 1.2), TH, NOW)
    assert quiet_day.value == pytest.approx(2.4)


def test_cost_outlier_against_family_median():
    family = [RunRecord(f"p{i}", family="digits", status="SUCCEEDED", cost_usd=1.0 + 0.1 * i) for i in range(4)]
    spike = RunRecord("spike", family="digits", status="SUCCEEDED", cost_usd=5.0)
    alert = cost_outlier(spike, family + [spike], TH)
    assert alert is not None and "of its family 'digits'" in alert.what and alert.value > 3
    normal = RunRecord("normal", family="digits", status="SUCCEEDED", cost_usd=1.5)
    assert cost_outlier(normal, family, TH) is None
    other_family = [RunRecord(f"o{i}", family="other", status="SUCCEEDED", cost_usd=0.01) for i in range(5)]
    assert cost_outlier(normal, other_family, TH) is None  # no peers in its own family
    assert cost_outlier(spike, family[:2], TH) is None  # too few peers to compare


def test_cost_outlier_prefers_the_sweep():
    sweep = [RunRecord(f"t{i}", family="f", sweep="s1", status="SUCCEEDED", cost_usd=10.0) for i in range(3)]
    family = [RunRecord(f"x{i}", family="f", status="SUCCEEDED", cost_usd=0.1) for i in range(3)]
    trial = RunRecord("trial", family="f", sweep="s1", cost_usd=12.0)
    assert cost_outlier(trial, sweep + family, TH) is None  # 1.2x its sweep, though 120x the family


def test_evaluate_run_names_every_rule_and_evaluate_live_finds_what_is_wrong_now():
    run = RunRecord("r", data_wait_fraction=0.5, checkpoint_overhead=0.0, queued_at=0.0, started_at=1.0)
    results = evaluate_run(run, [], TH, now=10.0)
    assert set(results) == {"low_utilization", "data_wait", "checkpoint_overhead", "cost_outlier", "queue_wait"}
    assert [name for name, alert in results.items() if alert] == ["data_wait"]
    queued = RunRecord("q", status="QUEUED", queued_at=NOW - 3 * HOUR)
    idle = RunRecord("idle", status="RUNNING", started_at=NOW - HOUR, utilization=samples([5] * 12))
    busy = RunRecord("busy", status="RUNNING", started_at=NOW - HOUR, utilization=samples([95] * 12))
    live = evaluate_live(_finished(18, 2) + [queued, idle, busy], TH, NOW, _spend("vision", [1.0] * 24, 9.0))
    assert sorted((a.rule, a.run_id if not a.period else a.team) for a in live) == [
        ("failure_rate", "vision"),
        ("low_utilization", "idle"),
        ("queue_wait", "q"),
        ("spend_spike", "vision"),
    ]


def test_alert_text_says_what_where_and_what_to_look_at():
    alert = data_wait(RunRecord("run-42", data_wait_fraction=0.3), TH)
    text = alert.text()
    assert text.startswith("[data_wait] run run-42: ") and "Look at: " in text


def test_thresholds_are_validated():
    with pytest.raises(ValueError):
        AlertThresholds(utilization_min_pct=150)
    with pytest.raises(ValueError):
        AlertThresholds(typo=1)
