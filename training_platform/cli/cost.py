"""`tp cost window|report|breakeven`: prices and totals on the command line (no Dagster needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.table import Table

from training_platform.cli.terminal import console
from training_platform.cost.accounting import month_start
from training_platform.cost.backends import open_ledger
from training_platform.cost.breakeven import OwnershipCase, breakeven
from training_platform.cost.prices import CostError, load_price_model
from training_platform.cost.windows import cost_window_for
from training_platform.paths import PlatformHome

cost_app = typer.Typer(no_args_is_help=True, help="Prices, cost windows, spend per team and sweep, rent or own.")
JsonFlag = Annotated[bool, typer.Option("--json", help="end with one JSON object on the last line")]


def parse_when(text: str, now: datetime) -> datetime:
    """ISO 8601 time, or a span from now: 36h, 2d, 90m."""
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now + timedelta(**{units[text[-1]]: float(text[:-1])})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CostError(f"{text!r} is not a time; use ISO 8601 (2026-11-24T06:00Z) or a span like 36h or 2d") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _fail(exc: CostError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"status": "REFUSED", "error": str(exc)}))
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    raise typer.Exit(exc.exit_code)


def _print(data: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(data, default=str))
        return
    table = Table(title=title, show_header=False, box=None)
    for key, value in data.items():
        table.add_row(f"[bold]{key}[/bold]", str(value))
    console.print(table)


@cost_app.command("window")
def window_command(
    gpu_hours: Annotated[float, typer.Argument(help="GPU-hours of work, e.g. 64")],
    gpu_type: Annotated[str, typer.Option("--gpu", help="GPU type, e.g. H100")] = "H100",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs working in parallel")] = 8,
    deadline: Annotated[str | None, typer.Option("--deadline", help="ISO time or span (36h, 2d); default 7d")] = None,
    on_demand: Annotated[bool, typer.Option("--on-demand", help="price on-demand capacity instead of spot")] = False,
    region: Annotated[str | None, typer.Option("--region", help="price region; default: the table's")] = None,
    now: Annotated[str | None, typer.Option("--now", help="pretend it is this time (ISO), for planning")] = None,
    ec2_history: Annotated[bool, typer.Option("--ec2-history", help="use EC2 spot price history (AWS creds)")] = False,
    as_json: JsonFlag = False,
) -> None:
    """The cheapest start before the deadline, its expected cost, and the saving against starting now."""
    try:
        start = parse_when(now, datetime.now(UTC)) if now else datetime.now(UTC)
        model = load_price_model()
        if ec2_history:
            from training_platform.cost.ec2_feed import ec2_client, model_with_ec2_feed

            region = region or model.default_region
            model = model_with_ec2_feed(model, ec2_client(region), region)
        window = cost_window_for(
            gpu_hours, gpu_type, parse_when(deadline, start) if deadline else None, not on_demand,
            gpus=gpus, now=start, region=region, model=model,
        )
    except CostError as exc:
        _fail(exc, as_json)
    _print(window.as_dict(), as_json, "cost window")


@cost_app.command("report")
def report_command(
    team: Annotated[str | None, typer.Option("--team", help="only this team")] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO date; default: start of this month")] = None,
    by: Annotated[str, typer.Option("--by", help="group by team, sweep, run or day (UTC)")] = "team",
    as_json: JsonFlag = False,
) -> None:
    """Spend from the cost ledger: every attempt of every run (succeeded, preempted, failed, cancelled) at its
    wall time x price, the badput (paid time that trained nothing kept) and lost work apart, and goodput."""
    try:
        start = parse_when(since, datetime.now(UTC)) if since else month_start()
        totals = open_ledger(PlatformHome.from_env().root).totals(by, since=start, team=team)
    except CostError as exc:
        _fail(exc, as_json)
    if as_json:
        everything = summed_totals(totals)
        print(json.dumps({"since": start.isoformat(), "by": by, "totals": totals, "total": everything}))
        return
    table = Table(by, "runs", "attempts", "accel-hours", "compute $", "badput $", "lost work $", "storage $",
                  "total $", "goodput", title=f"spend since {start:%Y-%m-%d}")
    for name, row in sorted(totals.items()):
        goodput = "-" if row["goodput"] is None else f"{row['goodput']:.1%}"
        table.add_row(name, f"{row['runs']:.0f}", f"{row['attempts']:.0f}", f"{row['accelerator_hours']:.3f}",
                      f"{row['compute_usd']:.4f}", f"{row['badput_usd']:.4f}", f"{row['lost_work_usd']:.4f}",
                      f"{row['storage_usd']:.4f}", f"{row['total_usd']:.4f}", goodput)
    console.print(table)


def summed_totals(totals: dict[str, dict[str, float]]) -> dict[str, float]:
    """The report's grand total: the sum of its groups (runs counted once per group)."""
    names = ("attempts", "accelerator_hours", "wall_seconds", "useful_seconds", "compute_usd", "badput_usd",
             "lost_work_usd", "storage_usd", "transfer_usd", "total_usd")
    out = {name: sum(row[name] for row in totals.values()) for name in names}
    out["goodput"] = out["useful_seconds"] / out["wall_seconds"] if out["wall_seconds"] else None
    return out


@cost_app.command("breakeven")
def breakeven_command(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to buy or rent")] = 64,
    gpu_type: Annotated[str, typer.Option("--gpu", help="GPU type priced for renting")] = "H100",
    rent: Annotated[float | None, typer.Option("--rent", help="$/GPU-hour to rent; default: on-demand")] = None,
    purchase: Annotated[float, typer.Option("--purchase", help="$ per GPU, server share included")] = 35_000,
    utilization: Annotated[float, typer.Option("--utilization", help="busy share of the month, 0..1")] = 0.6,
    power_kw: Annotated[float, typer.Option("--power-kw", help="kW per GPU incl. host and cooling")] = 1.0,
    power_price: Annotated[float, typer.Option("--power-price", help="$/kWh")] = 0.12,
    hosting: Annotated[float, typer.Option("--hosting", help="$/GPU-month rack space, support")] = 150.0,
    engineering: Annotated[float, typer.Option("--engineering", help="$/month of people running it")] = 10_000,
    depreciation_years: Annotated[float, typer.Option("--depreciation-years", help="write-off period")] = 4.0,
    as_json: JsonFlag = False,
) -> None:
    """Rent versus own: monthly costs and the month in which owning becomes cheaper."""
    try:
        rent_price = rent if rent is not None else load_price_model().base_price(gpu_type, spot=False)
        result = breakeven(OwnershipCase(
            gpus=gpus, rent_per_gpu_hour=rent_price, utilization=utilization, purchase_per_gpu=purchase,
            power_kw_per_gpu=power_kw, power_per_kwh=power_price, hosting_per_gpu_month=hosting,
            engineering_per_month=engineering, depreciation_years=depreciation_years,
        ))
    except CostError as exc:
        _fail(exc, as_json)
    data = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.as_dict().items()}
    data["rent_per_gpu_hour"] = rent_price
    data["breakeven_month"] = data.pop("month")
    _print(data, as_json, "rent or own")
