"""Team budgets (dollars per calendar month, UTC), checked at submission before anything is queued.

The table is YAML: ``teams: {vision: {monthly_usd: 500}}`` at ``$TP_BUDGETS`` or ``$TP_HOME/budgets.yaml``.
A team without an entry has no budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from training_platform.cost.accounting import CostLedger, month_start
from training_platform.cost.prices import CostError, PriceModel, load_price_model
from training_platform.spec import TrainSpec

BUDGETS_FILE = "budgets.yaml"


class BudgetError(CostError):
    """A submission would take a team over its budget; nothing was launched."""


@dataclass(frozen=True)
class BudgetDecision:
    team: str
    budget_usd: float | None
    spent_usd: float
    estimate_usd: float
    since: datetime

    @property
    def allowed(self) -> bool:
        if self.budget_usd is None:
            return True
        return self.spent_usd < self.budget_usd and self.spent_usd + self.estimate_usd <= self.budget_usd


def budgets_path(home_root: Path) -> Path:
    return Path(os.environ.get("TP_BUDGETS") or Path(home_root) / BUDGETS_FILE)


def load_budgets(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    teams = data.get("teams", {}) if isinstance(data, dict) else None
    if not isinstance(teams, dict):
        raise CostError(f"{path}: expected `teams: {{<team>: {{monthly_usd: <dollars>}}}}`")
    budgets = {}
    for team, entry in teams.items():
        value = entry.get("monthly_usd") if isinstance(entry, dict) else None
        if not isinstance(value, int | float) or value < 0:
            raise CostError(f"{path}: teams.{team}.monthly_usd must be a number of dollars >= 0")
        budgets[team] = float(value)
    return budgets


def estimate_run_usd(spec: TrainSpec, model: PriceModel | None = None) -> float:
    """What a run is expected to cost: its cap when set, else expected hours at the average price, else 0."""
    if spec.cost.max_usd is not None:
        return spec.cost.max_usd
    if spec.cost.expected_hours is None:
        return 0.0
    model = model or load_price_model()
    res = spec.resources
    units = res.nodes * (res.gpus_per_node if res.gpus_per_node else res.procs_per_node)
    gpu_type = res.gpu_type if res.gpus_per_node else None
    return spec.cost.expected_hours * units * model.base_price(gpu_type, res.spot)


def check_budget(home_root: Path, team: str, estimate_usd: float, now: datetime | None = None) -> BudgetDecision:
    """Raise BudgetError (naming team, budget and spend) when the submission does not fit this month's budget."""
    since = month_start(now)
    budget = load_budgets(budgets_path(home_root)).get(team)
    spent = CostLedger(Path(home_root) / "cost").spend(team, since) if budget is not None else 0.0
    decision = BudgetDecision(team, budget, spent, estimate_usd, since)
    if not decision.allowed:
        raise BudgetError(
            f"team {team!r} is over its monthly budget: spent ${spent:.2f} of ${budget:.2f} since "
            f"{since:%Y-%m-%d} (this submission is estimated at ${estimate_usd:.2f}); nothing was queued. "
            f"Raise teams.{team}.monthly_usd in {budgets_path(home_root)} or wait for next month"
        )
    return decision
