"""Team budgets (dollars per calendar month, UTC), checked before any run launches, on every path.

The training asset checks each run (`check_run_budget`) before it launches anything, so UI launches,
the nightly retrain, `tp retrain`, sweep trials, resumes and retries are all refused the same way;
`tp train`, `tp sweep` and `tp retrain` check early with the same functions and submit nothing.

Budgets are the ``monthly_usd`` of each team in the teams file (training_platform/policy/teams.py:
``$TP_TEAMS`` or ``$TP_HOME/teams.yaml``). An undeclared team is refused; a declared team without
``monthly_usd`` has no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from training_platform.cost.accounting import month_start
from training_platform.cost.backends import open_ledger
from training_platform.cost.charges import spec_key, template_of, units
from training_platform.cost.prices import CostError, PriceModel, load_price_model
from training_platform.policy.teams import declared_team
from training_platform.spec import TrainSpec

if TYPE_CHECKING:  # sweeps import cost: only the annotation is needed here
    from training_platform.sweeps.spec import SweepSpec


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


DEFAULT_SECONDS_PER_STEP = 1.0
"""Wall seconds per step when neither the spec nor its template has run before: deliberately high. On 2 CPU
processes here, digits_mlp took 0.011 s a step with its start-up spread over 300 steps (3.2 s in all, measured
by tests/integration/test_attempt_charging.py) and gpt tiny takes 0.3-0.9 s (the checkpoint figures in the
README); a run slower than this is estimated from its own history after its first attempt."""


@dataclass(frozen=True)
class Estimate:
    usd: float
    basis: str  # how it was reached, for the refusal message


def estimate_run(
    spec: TrainSpec, home_root: Path | None = None, from_step: int = 0, model: PriceModel | None = None
) -> Estimate:
    """What a run (or the rest of it, resumed at `from_step`) is expected to cost; never $0 for want of a field.

    In order: its cap (`cost.max_usd`); its expected hours (`cost.expected_hours`, pro rata for a resume);
    else its remaining steps x the wall seconds per kept step of earlier attempts of the same spec, else of
    the same template on the same GPU type (from the ledger, start-up and preemptions included), else
    DEFAULT_SECONDS_PER_STEP; at the average price of its capacity.
    """
    if spec.cost.max_usd is not None:
        return Estimate(spec.cost.max_usd, "its cost.max_usd")
    model = model or load_price_model()
    count = units(spec)
    gpu_type = spec.resources.gpu_type if spec.resources.gpus_per_node else None
    price = model.base_price(gpu_type, spec.resources.spot)
    remaining = max(spec.training.max_steps - from_step, 1)
    pricing = f"x {count} unit(s) x ${price:.4g}/unit-hour"
    if spec.cost.expected_hours is not None:
        hours = spec.cost.expected_hours * remaining / spec.training.max_steps
        return Estimate(hours * count * price, f"{hours:.3g} h of cost.expected_hours {pricing}")
    seconds, source = seconds_per_step(spec, home_root)
    usd = remaining * seconds / 3600.0 * count * price
    return Estimate(usd, f"{remaining} steps x {seconds:.3g} s/step ({source}) {pricing}")


def seconds_per_step(spec: TrainSpec, home_root: Path | None) -> tuple[float, str]:
    """Measured wall seconds per kept step of earlier attempts like this run's, and where the figure comes from."""
    ledger = open_ledger(Path(home_root)) if home_root else None
    rows = [r for r in ledger.records() if r.get("kind") == "attempt"] if ledger else []
    key, template = spec_key(spec), template_of(spec)
    gpu_type = spec.resources.gpu_type if spec.resources.gpus_per_node else None
    matches = (
        ("this spec", lambda r: r.get("spec_key") == key),
        (f"template {template}", lambda r: r.get("template") == template and r.get("gpu_type") == gpu_type),
    )
    for label, match in matches:
        alike = [r for r in rows if match(r)]
        kept = sum(max(int(r["steps"]) - int(r["lost_steps"]), 0) for r in alike)
        if kept:
            runs = len({r["run_id"] for r in alike})
            return sum(r["wall_seconds"] for r in alike) / kept, f"measured on {runs} earlier run(s) of {label}"
    return DEFAULT_SECONDS_PER_STEP, "the default: no earlier run of this spec or template"


def check_run_budget(spec: TrainSpec, home_root: Path, from_step: int = 0, stage: str = "queued") -> BudgetDecision:
    """The budget gate of one run, shared by `tp` (before submitting) and the training asset (before launching)."""
    estimate = estimate_run(spec, home_root, from_step)
    return check_budget(home_root, spec.team, estimate.usd, basis=estimate.basis, stage=stage)


def check_budget(
    home_root: Path, team: str, estimate_usd: float, now: datetime | None = None, *, basis: str = "",
    stage: str = "queued",
) -> BudgetDecision:
    """Raise BudgetError (naming team, budget, spend, estimate and the fix) when the submission does not fit
    this month's budget; `stage` says what did not happen (queued, launched)."""
    since = month_start(now)
    declared, path = declared_team(team, home_root)
    budget = declared.monthly_usd
    spent = open_ledger(Path(home_root)).spend(team, since) if budget is not None else 0.0
    decision = BudgetDecision(team, budget, spent, estimate_usd, since)
    if not decision.allowed:
        how = f": {basis}" if basis else ""
        raise BudgetError(
            f"team {team!r} is over its monthly budget: spent ${spent:.2f} of ${budget:.2f} since "
            f"{since:%Y-%m-%d} (this submission is estimated at ${estimate_usd:.2f}{how}); nothing was {stage}. "
            f"Raise teams.{team}.monthly_usd in {path}, lower training.max_steps or cost.max_usd, or wait for "
            "next month"
        )
    return decision


def sweep_estimate_usd(sweep: SweepSpec, home_root: Path | None = None) -> float:
    """A sweep's cap (`limits.max_usd`), else its trials at the estimate of its base spec."""
    if sweep.limits.max_usd is not None:
        return sweep.limits.max_usd
    return sweep.limits.max_trials * estimate_run(sweep.base_spec, home_root).usd
