"""Cost windows: the cheapest time to start a job of known length before its deadline.

The price is constant within each hour of the week, so the cost of a window as a function of
its start time is piecewise linear; its minimum lies where the start or the end of the window
crosses an hour boundary, or at the ends of the allowed range. Checking those candidates gives
the exact optimum over all (continuous) start times, not only whole hours.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from training_platform.cost.prices import CostError, HourlyCurve, PriceModel, load_price_model

DEFAULT_HORIZON = timedelta(days=7)
_HOUR = 3600.0
_EPS = 1e-9


@dataclass(frozen=True)
class CostWindow:
    """When to start, what it is expected to cost, and what starting now would cost instead."""

    start: datetime
    end: datetime
    expected_cost: float
    cost_if_now: float
    gpu_hours: float
    gpus: int
    gpu_type: str | None
    spot: bool
    region: str

    @property
    def saving(self) -> float:
        return self.cost_if_now - self.expected_cost

    @property
    def saving_fraction(self) -> float:
        return self.saving / self.cost_if_now if self.cost_if_now else 0.0

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(
            start=self.start.isoformat(),
            end=self.end.isoformat(),
            expected_cost=round(self.expected_cost, 4),
            cost_if_now=round(self.cost_if_now, 4),
            saving=round(self.saving, 4),
            saving_fraction=round(self.saving_fraction, 4),
        )
        return data


def window_cost(curve: HourlyCurve, start: datetime, hours: float, gpus: int = 1) -> float:
    """Integral of the hourly price over [start, start + hours), times the number of GPUs."""
    t = start.astimezone(UTC).timestamp()
    end = t + hours * _HOUR
    total = 0.0
    while t < end - _EPS:
        hour_end = (t // _HOUR + 1) * _HOUR
        segment = min(hour_end, end) - t
        total += curve.prices[_index(t)] * segment / _HOUR
        t = min(hour_end, end)
    return total * gpus


def _index(timestamp: float) -> int:
    # 1970-01-01 was a Thursday (weekday 3): shift so that Monday 00:00 UTC is index 0.
    return int((timestamp // _HOUR + 3 * 24) % 168)


def cheapest_start(curve: HourlyCurve, now: datetime, hours: float, deadline: datetime) -> tuple[datetime, float]:
    """The earliest start in [now, deadline - hours] whose window costs the least (per GPU)."""
    if hours <= 0:
        raise CostError(f"a window needs a positive length, got {hours} hours")
    t0 = now.astimezone(UTC).timestamp()
    latest = deadline.astimezone(UTC).timestamp() - hours * _HOUR
    if latest < t0 - _EPS:
        raise CostError(
            f"the job needs {hours:.2f} h but the deadline is {(deadline - now).total_seconds() / _HOUR:.2f} h away; "
            "move the deadline later or use more GPUs"
        )
    latest = max(latest, t0)
    candidates = {t0, latest}
    for shift in (0.0, hours * _HOUR):
        boundary = ((t0 + shift) // _HOUR + 1) * _HOUR
        while boundary - shift <= latest:
            candidates.add(boundary - shift)
            boundary += _HOUR
    best: tuple[float, float] | None = None
    for t in sorted(candidates):
        cost = window_cost(curve, datetime.fromtimestamp(t, UTC), hours)
        if best is None or cost < best[1] - _EPS * max(1.0, abs(best[1])):
            best = (t, cost)
    assert best is not None
    return datetime.fromtimestamp(best[0], UTC), best[1]


def cost_window_for(
    gpu_hours: float,
    gpu_type: str | None,
    deadline: datetime | None,
    spot: bool,
    *,
    gpus: int = 1,
    now: datetime | None = None,
    region: str | None = None,
    model: PriceModel | None = None,
) -> CostWindow:
    """The cheapest start before `deadline` for `gpu_hours` of work spread over `gpus` GPUs."""
    if gpus < 1:
        raise CostError(f"gpus must be >= 1, got {gpus}")
    if gpu_hours <= 0:
        raise CostError(f"gpu_hours must be > 0, got {gpu_hours}")
    model = model or load_price_model()
    now = (now or datetime.now(UTC)).astimezone(UTC)
    deadline = (deadline or now + DEFAULT_HORIZON).astimezone(UTC)
    region = region or model.default_region
    curve = model.curve(gpu_type, spot, region)
    hours = gpu_hours / gpus
    start, per_gpu = cheapest_start(curve, now, hours, deadline)
    return CostWindow(
        start=start,
        end=start + timedelta(hours=hours),
        expected_cost=per_gpu * gpus,
        cost_if_now=window_cost(curve, now, hours, gpus),
        gpu_hours=gpu_hours,
        gpus=gpus,
        gpu_type=gpu_type,
        spot=spot,
        region=region,
    )
