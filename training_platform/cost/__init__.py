"""Cost: the GPU price model, cost windows (for runs too: run_windows.py), per-run accounting, team budgets,
right-sizing (plan.py) and rent-versus-own."""

from training_platform.cost.accounting import CostLedger, RunCost, month_start, run_cost
from training_platform.cost.breakeven import Breakeven, OwnershipCase, breakeven
from training_platform.cost.budgets import BudgetError, Estimate, check_budget, check_run_budget, estimate_run
from training_platform.cost.prices import CostError, HourlyCurve, PriceModel, load_price_model
from training_platform.cost.windows import CostWindow, cheapest_start, cost_window_for, window_cost

__all__ = [
    "Breakeven",
    "BudgetError",
    "CostError",
    "CostLedger",
    "CostWindow",
    "Estimate",
    "HourlyCurve",
    "OwnershipCase",
    "PriceModel",
    "RunCost",
    "breakeven",
    "check_budget",
    "check_run_budget",
    "cheapest_start",
    "cost_window_for",
    "estimate_run",
    "load_price_model",
    "month_start",
    "run_cost",
    "window_cost",
]
