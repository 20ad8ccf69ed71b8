"""Per-run cost, the ledger's totals, team budgets at submission, and rent-versus-own."""

from datetime import UTC, datetime, timedelta

import pytest

from training_platform.cost import (
    BudgetError,
    CostLedger,
    OwnershipCase,
    breakeven,
    check_budget,
    estimate_run,
    load_price_model,
    run_cost,
)
from training_platform.spec import parse_spec

NIGHT = datetime(2026, 11, 24, 4, tzinfo=UTC)  # Tuesday 04:00 UTC: off-peak spot


def spec(team="vision", spot=True, **cost):
    return parse_spec({
        "name": "r", "team": team, "owner": "me", "cost": cost,
        "resources": {"nodes": 2, "procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100", "spot": spot},
    })


def test_run_cost_prices_gpu_hours_by_capacity_and_storage():
    model = load_price_model()
    cost = run_cost(spec(), "r1", 1800, checkpoint_bytes=10 * 1024**3, ended=NIGHT, model=model)
    assert cost.capacity == "spot" and cost.accelerator_hours == pytest.approx(8.0)
    assert cost.compute_usd == pytest.approx(8.0 * model.price_at("H100", True, NIGHT))
    assert cost.storage_usd == pytest.approx(10 * 0.023)
    assert cost.total_usd == pytest.approx(cost.compute_usd + cost.storage_usd)
    on_demand = run_cost(spec(spot=False), "r2", 1800, ended=NIGHT, model=model)
    assert on_demand.compute_usd == pytest.approx(8.0 * 6.88) and on_demand.compute_usd > cost.compute_usd


def test_ledger_totals_per_team_and_sweep(tmp_path):
    ledger = CostLedger(tmp_path)
    for i, (team, sweep) in enumerate([("a", "s1"), ("a", "s1"), ("b", None)]):
        ledger.record(run_cost(spec(team=team), f"r{i}", 360, sweep=sweep, ended=NIGHT))
    by_team = ledger.totals("team")
    assert by_team["a"]["runs"] == 2 and by_team["b"]["runs"] == 1
    assert ledger.totals("sweep")["s1"]["total_usd"] == pytest.approx(by_team["a"]["total_usd"])
    assert ledger.records(since=NIGHT + timedelta(seconds=1)) == []


def _teams(tmp_path, monkeypatch, text: str) -> None:
    (tmp_path / "teams.yaml").write_text(text)
    monkeypatch.delenv("TP_TEAMS")  # the home's own teams file (training_platform/policy/teams.py)


def test_over_budget_submission_is_refused_naming_team_budget_and_spend(tmp_path, monkeypatch):
    _teams(tmp_path, monkeypatch, "teams:\n  vision: {monthly_usd: 100}\n  other-team: {}\n")
    ledger = CostLedger(tmp_path / "cost")
    ledger.record(run_cost(spec(spot=False), "r1", 3600, ended=datetime.now(UTC)))  # 16 GPU-h on demand: $110
    with pytest.raises(BudgetError) as refused:
        check_budget(tmp_path, "vision", 0.0)
    message = str(refused.value)
    assert "'vision'" in message and "$100.00" in message and "$110.08" in message and "nothing was queued" in message
    assert check_budget(tmp_path, "other-team", 1e9).allowed  # declared without a budget: no limit


def test_estimate_pushing_spend_over_budget_is_refused(tmp_path, monkeypatch):
    _teams(tmp_path, monkeypatch, "teams:\n  vision: {monthly_usd: 50}\n")
    assert estimate_run(spec(max_usd=20)).usd == 20
    assert estimate_run(spec(spot=False, expected_hours=0.25)).usd == pytest.approx(16 * 0.25 * 6.88)
    assert check_budget(tmp_path, "vision", 20).allowed
    with pytest.raises(BudgetError, match="estimated at \\$60.00"):
        check_budget(tmp_path, "vision", 60)


def test_breakeven_month_and_never_when_utilization_is_low():
    case = OwnershipCase(gpus=64, rent_per_gpu_hour=6.88, utilization=0.7, purchase_per_gpu=35_000)
    result = breakeven(case)
    month = result.month
    assert month is not None
    _, rent, own = result.rows[month - 1]
    assert own <= rent
    _, rent_before, own_before = result.rows[month - 2]
    assert own_before > rent_before
    idle = breakeven(OwnershipCase(gpus=8, rent_per_gpu_hour=2.0, utilization=0.05, purchase_per_gpu=35_000))
    assert idle.month is None
