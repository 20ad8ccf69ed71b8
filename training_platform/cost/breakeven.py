"""Rent or own: the month in which buying GPUs becomes cheaper than renting the same GPU-hours."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from training_platform.cost.prices import CostError

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class OwnershipCase:
    """The inputs of the comparison; every price in USD."""

    gpus: int
    rent_per_gpu_hour: float
    utilization: float  # share of the month the GPUs do useful work (0..1]
    purchase_per_gpu: float  # server share included
    power_kw_per_gpu: float = 1.0  # GPU plus its share of host, network and cooling
    power_per_kwh: float = 0.12
    hosting_per_gpu_month: float = 150.0  # rack space, support contracts
    engineering_per_month: float = 10_000.0  # people who keep owned clusters running
    depreciation_years: float = 4.0
    horizon_months: int = 60


@dataclass(frozen=True)
class Breakeven:
    rent_per_month: float
    own_per_month: float
    upfront: float
    month: int | None  # first month where cumulative owning <= cumulative renting; None within horizon
    depreciation_months: int
    rows: list[tuple[int, float, float]]  # (month, cumulative rent, cumulative own)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("rows")
        data["pays_off_within_depreciation"] = self.month is not None and self.month <= self.depreciation_months
        return data


def breakeven(case: OwnershipCase) -> Breakeven:
    """Cumulative cost month by month; owning pays the purchase up front, renting pays only used hours."""
    if case.gpus < 1:
        raise CostError(f"gpus must be >= 1, got {case.gpus}")
    if not 0 < case.utilization <= 1:
        raise CostError(f"utilization must be in (0, 1], got {case.utilization}; 0.6 means 60 % busy")
    if case.rent_per_gpu_hour <= 0 or case.purchase_per_gpu <= 0:
        raise CostError("rent and purchase prices must be > 0")
    busy_hours = case.gpus * HOURS_PER_MONTH * case.utilization
    rent = busy_hours * case.rent_per_gpu_hour
    # Owned GPUs draw power when busy; idle draw is folded into hosting.
    own = (
        busy_hours * case.power_kw_per_gpu * case.power_per_kwh
        + case.gpus * case.hosting_per_gpu_month
        + case.engineering_per_month
    )
    upfront = case.gpus * case.purchase_per_gpu
    rows, month = [], None
    for m in range(1, case.horizon_months + 1):
        cumulative_rent, cumulative_own = rent * m, upfront + own * m
        rows.append((m, cumulative_rent, cumulative_own))
        if month is None and cumulative_own <= cumulative_rent:
            month = m
    return Breakeven(rent, own, upfront, month, round(case.depreciation_years * 12), rows)
