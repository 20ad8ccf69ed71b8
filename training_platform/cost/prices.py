"""The GPU price model: $/GPU-hour by type, region and capacity, and the spot hour-of-week curve.

The shipped table is `prices.yaml` (sources in `SOURCES.md`); a user's table (``$TP_PRICES`` or
``$TP_HOME/prices.yaml``) is merged over it, entry by entry.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from training_platform.errors import PlatformError

SHIPPED_PRICES = Path(__file__).with_name("prices.yaml")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
HOURS_PER_WEEK = 168


class CostError(PlatformError):
    """A price, window or budget question cannot be answered as asked."""

    exit_code = 2


@dataclass(frozen=True)
class HourlyCurve:
    """A price in $/hour that is constant within each UTC hour of the week (168 values, Monday 00:00 first)."""

    prices: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.prices) != HOURS_PER_WEEK:
            raise CostError(f"an hour-of-week curve needs {HOURS_PER_WEEK} values, got {len(self.prices)}")
        if any(p < 0 for p in self.prices):
            raise CostError("an hour-of-week curve has a negative price; prices must be >= 0")

    @staticmethod
    def hour_index(at: datetime) -> int:
        at = at.astimezone(UTC)
        return at.weekday() * 24 + at.hour

    def price_at(self, at: datetime) -> float:
        return self.prices[self.hour_index(at)]

    def scaled(self, factor: float) -> HourlyCurve:
        return HourlyCurve(tuple(p * factor for p in self.prices))


@dataclass(frozen=True)
class PriceModel:
    """Prices for compute, storage and transfer; the answer to 'what does an hour of X cost at time T'."""

    table: dict[str, Any]

    @property
    def default_region(self) -> str:
        return self.table.get("default_region", "us-east-1")

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.table["gpus"])

    @property
    def storage_per_gb_month(self) -> float:
        return float(self.table["storage_per_gb_month"])

    @property
    def transfer_per_gb(self) -> float:
        return float(self.table["transfer_per_gb"])

    def spot_multipliers(self) -> tuple[float, ...]:
        rows = self.table["spot_hour_of_week"]
        return tuple(float(v) for day in DAYS for v in rows[day])

    def base_price(self, gpu_type: str | None, spot: bool, region: str | None = None) -> float:
        """Average $/GPU-hour (or $/process-hour for CPU when gpu_type is None)."""
        region = region or self.default_region
        if gpu_type is None:
            return _regional(self.table["cpu_per_process_hour"], region, "cpu_per_process_hour")
        entry = self.table["gpus"].get(gpu_type)
        if entry is None:
            raise CostError(f"no price for GPU type {gpu_type!r}; add it to your price table or use one of: "
                            f"{', '.join(self.gpu_types)}")
        return _regional(entry["spot" if spot else "on_demand"], region, f"gpus.{gpu_type}")

    def curve(self, gpu_type: str | None, spot: bool, region: str | None = None) -> HourlyCurve:
        """$/GPU-hour for each hour of the week: flat on-demand, shaped spot."""
        base = self.base_price(gpu_type, spot, region)
        if not spot:
            return HourlyCurve((base,) * HOURS_PER_WEEK)
        return HourlyCurve(self.spot_multipliers()).scaled(base)

    def price_at(self, gpu_type: str | None, spot: bool, at: datetime, region: str | None = None) -> float:
        return self.curve(gpu_type, spot, region).price_at(at)


def _regional(prices: dict[str, float], region: str, where: str) -> float:
    if region not in prices:
        raise CostError(f"{where}: no price for region {region!r}; add it to your price table or use one of: "
                        f"{', '.join(prices)}")
    return float(prices[region])


def merge_tables(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Override entries win, merged per GPU type and per region; a curve is replaced whole."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if key == "gpus":
            for gpu, entry in value.items():
                target = merged["gpus"].setdefault(gpu, {})
                for field, sub in entry.items():
                    if isinstance(sub, dict):
                        target.setdefault(field, {}).update(sub)
                    else:
                        target[field] = sub
        elif isinstance(value, dict) and key != "spot_hour_of_week" and isinstance(merged.get(key), dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


def _validate(table: dict[str, Any], source: str) -> None:
    rows = table.get("spot_hour_of_week", {})
    for day in DAYS:
        if len(rows.get(day, ())) != 24:
            raise CostError(f"{source}: spot_hour_of_week.{day} needs 24 values (one per UTC hour)")
    for gpu, entry in table.get("gpus", {}).items():
        for capacity in ("on_demand", "spot"):
            if not isinstance(entry.get(capacity), dict) or not entry[capacity]:
                raise CostError(f"{source}: gpus.{gpu}.{capacity} must map region -> $/GPU-hour")


def load_price_model(override: str | Path | None = None) -> PriceModel:
    """The shipped table, with the user's table (argument, $TP_PRICES, or $TP_HOME/prices.yaml) merged over it."""
    table = yaml.safe_load(SHIPPED_PRICES.read_text())
    candidates = [override, os.environ.get("TP_PRICES")]
    if os.environ.get("TP_HOME"):
        candidates.append(Path(os.environ["TP_HOME"]) / "prices.yaml")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            user = yaml.safe_load(Path(candidate).read_text()) or {}
            if not isinstance(user, dict):
                raise CostError(f"{candidate}: a price table must be a mapping (see {SHIPPED_PRICES})")
            table = merge_tables(table, user)
            _validate(table, str(candidate))
            break
        if candidate and candidate is override:
            raise CostError(f"price table {candidate} does not exist; pass an existing YAML file")
    _validate(table, str(SHIPPED_PRICES))
    return PriceModel(table)
