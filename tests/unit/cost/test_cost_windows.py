"""Cost windows: the chosen start is the true optimum of the price curve before the deadline."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_platform.cost import (
    CostError,
    HourlyCurve,
    cheapest_start,
    cost_window_for,
    load_price_model,
    window_cost,
)

MONDAY = datetime(2026, 11, 23, tzinfo=UTC)  # a Monday, 00:00 UTC

curves = st.lists(st.floats(min_value=0.0, max_value=50.0, allow_nan=False), min_size=168, max_size=168).map(
    lambda prices: HourlyCurve(tuple(prices))
)


def brute_force(curve: HourlyCurve, now: datetime, minutes: int, deadline: datetime) -> float:
    """The cheapest cost over every start minute from now to the latest start that meets the deadline."""
    latest = int((deadline - now).total_seconds() // 60) - minutes
    per_minute = [curve.price_at(now + timedelta(minutes=m)) / 60 for m in range(latest + minutes + 1)]
    window = sum(per_minute[:minutes])
    best = window
    for start in range(1, latest + 1):
        window += per_minute[start + minutes - 1] - per_minute[start - 1]
        best = min(best, window)
    return best


@settings(max_examples=60, deadline=None)
@given(
    curve=curves,
    start_minute=st.integers(min_value=0, max_value=7 * 24 * 60 - 1),
    minutes=st.integers(min_value=1, max_value=12 * 60),
    slack_minutes=st.integers(min_value=0, max_value=30 * 60),
)
def test_chosen_window_is_the_brute_force_optimum(curve, start_minute, minutes, slack_minutes):
    now = MONDAY + timedelta(minutes=start_minute)
    deadline = now + timedelta(minutes=minutes + slack_minutes)
    start, cost = cheapest_start(curve, now, minutes / 60, deadline)
    assert now <= start and start + timedelta(minutes=minutes) <= deadline + timedelta(microseconds=1)
    assert cost == pytest.approx(window_cost(curve, start, minutes / 60), rel=1e-9, abs=1e-9)
    assert cost == pytest.approx(brute_force(curve, now, minutes, deadline), rel=1e-7, abs=1e-7)


@settings(max_examples=30, deadline=None)
@given(hours=st.integers(min_value=1, max_value=48), slack=st.integers(min_value=0, max_value=120))
def test_shipped_spot_curve_window_never_costs_more_than_now(hours, slack):
    now = MONDAY + timedelta(hours=15)  # Monday afternoon, US business hours: the dear part of the week
    window = cost_window_for(hours * 8, "H100", now + timedelta(hours=hours + slack), True, gpus=8, now=now)
    assert window.expected_cost <= window.cost_if_now + 1e-9
    assert window.end <= now + timedelta(hours=hours + slack)


def test_window_moves_a_spot_job_out_of_peak_hours():
    now = MONDAY + timedelta(hours=14)
    window = cost_window_for(64, "H100", now + timedelta(days=2), True, gpus=8, now=now)
    assert window.start > now
    assert window.saving_fraction > 0.15
    assert window.expected_cost == pytest.approx(
        window_cost(load_price_model().curve("H100", True), window.start, 8, 8)
    )


def test_on_demand_is_flat_so_the_window_is_now():
    now = MONDAY + timedelta(hours=14, minutes=17)
    window = cost_window_for(16, "A100-80GB", now + timedelta(days=1), False, gpus=4, now=now)
    assert window.start == now and window.saving == 0
    assert window.expected_cost == pytest.approx(16 * 3.431)


def test_deadline_too_close_is_refused_with_the_fix():
    with pytest.raises(CostError, match="move the deadline later or use more GPUs"):
        cost_window_for(64, "H100", MONDAY + timedelta(hours=4), True, gpus=8, now=MONDAY)
