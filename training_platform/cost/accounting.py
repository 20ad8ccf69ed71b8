"""What a run cost: compute by capacity type, checkpoint storage, data transfer, and work lost to preemptions.

Each finished run appends one record to the cost ledger (``$TP_HOME/cost/ledger.jsonl``); totals per
team and per sweep are sums over it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from training_platform.cost.prices import PriceModel, load_price_model
from training_platform.cost.windows import window_cost
from training_platform.spec import TrainSpec

GB = 1024**3
LEDGER = "ledger.jsonl"


@dataclass(frozen=True)
class RunCost:
    """One run's cost, broken down; every figure in USD unless its name says otherwise."""

    run_id: str
    team: str
    sweep: str | None
    at: str
    capacity: str  # "spot" or "on_demand"
    gpu_type: str | None
    accelerator_hours: float  # GPU-hours, or process-hours for CPU runs
    compute_usd: float
    storage_gb_months: float
    storage_usd: float
    transfer_gb: float
    transfer_usd: float
    lost_hours: float
    lost_work_usd: float
    total_usd: float
    extra: dict = field(default_factory=dict)

    def as_metadata(self) -> dict[str, float | str]:
        return {
            "cost_total_usd": round(self.total_usd, 6),
            "cost_compute_usd": round(self.compute_usd, 6),
            f"{'gpu' if self.gpu_type else 'cpu'}_hours_{self.capacity}": round(self.accelerator_hours, 6),
            "cost_storage_usd": round(self.storage_usd, 6),
            "cost_transfer_usd": round(self.transfer_usd, 6),
            "cost_lost_work_usd": round(self.lost_work_usd, 6),
            "lost_hours": round(self.lost_hours, 6),
        }


def run_cost(
    spec: TrainSpec,
    run_id: str,
    train_seconds: float,
    *,
    checkpoint_bytes: int = 0,
    retention_days: float = 30.0,
    transfer_bytes: int = 0,
    lost_steps: int = 0,
    final_step: int | None = None,
    sweep: str | None = None,
    ended: datetime | None = None,
    model: PriceModel | None = None,
) -> RunCost:
    """Price one run: accelerator-hours at the hour-of-week price of when it ran, plus storage and transfer.

    Lost work is the share of compute spent on steps that a preemption threw away (steps after the
    last checkpoint, recomputed on resume): it is part of compute, shown separately.
    """
    model = model or load_price_model()
    ended = (ended or datetime.now(UTC)).astimezone(UTC)
    res = spec.resources
    units = res.nodes * (res.gpus_per_node if res.gpus_per_node else res.procs_per_node)
    gpu_type = res.gpu_type if res.gpus_per_node else None
    hours = max(train_seconds, 0.0) / 3600.0
    curve = model.curve(gpu_type, res.spot, None)
    compute = window_cost(curve, ended - timedelta(seconds=train_seconds), hours, units) if hours else 0.0
    steps = final_step or spec.training.max_steps
    lost_fraction = min(lost_steps / (steps + lost_steps), 1.0) if lost_steps else 0.0
    gb_months = checkpoint_bytes / GB * retention_days / 30.0
    storage = gb_months * model.storage_per_gb_month
    transfer_gb = transfer_bytes / GB
    transfer = transfer_gb * model.transfer_per_gb
    return RunCost(
        run_id=run_id,
        team=spec.team,
        sweep=sweep,
        at=ended.isoformat(),
        capacity="spot" if res.spot else "on_demand",
        gpu_type=gpu_type,
        accelerator_hours=hours * units,
        compute_usd=compute,
        storage_gb_months=gb_months,
        storage_usd=storage,
        transfer_gb=transfer_gb,
        transfer_usd=transfer,
        lost_hours=hours * units * lost_fraction,
        lost_work_usd=compute * lost_fraction,
        total_usd=compute + storage + transfer,
    )


class CostLedger:
    """Append-only JSON lines of RunCost records; one line per finished run."""

    def __init__(self, root: Path):
        self.path = Path(root) / LEDGER

    def record(self, cost: RunCost) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One write of one line: appends from concurrent runs do not interleave on a local disk.
        with self.path.open("a") as handle:
            handle.write(json.dumps(asdict(cost)) + "\n")

    def records(self, team: str | None = None, since: datetime | None = None, sweep: str | None = None) -> list[dict]:
        if not self.path.is_file():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [
            r
            for r in rows
            if (team is None or r["team"] == team)
            and (sweep is None or r.get("sweep") == sweep)
            and (since is None or datetime.fromisoformat(r["at"]) >= since)
        ]

    def spend(self, team: str, since: datetime) -> float:
        return sum(r["total_usd"] for r in self.records(team=team, since=since))

    def totals(self, key: str, since: datetime | None = None, team: str | None = None) -> dict[str, dict[str, float]]:
        """Sums per `team` or per `sweep`: runs, accelerator-hours, compute, storage, lost work, total."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for r in self.records(team=team, since=since):
            group = r.get(key) or "-"
            row = out[group]
            row["runs"] += 1
            for name in ("accelerator_hours", "compute_usd", "storage_usd", "transfer_usd", "lost_work_usd"):
                row[name] += r[name]
            row["total_usd"] += r["total_usd"]
        return {k: dict(v) for k, v in out.items()}


def month_start(at: datetime | None = None) -> datetime:
    at = (at or datetime.now(UTC)).astimezone(UTC)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def record_run_cost(
    home_root: Path, spec: TrainSpec, run_id: str, result: dict, lost_steps: int = 0, sweep: str | None = None
) -> RunCost:
    """Price a finished run from its result (train time, checkpoint bytes) and append it to the ledger."""
    cost = run_cost(
        spec,
        run_id,
        float(result.get("train_seconds") or 0.0),
        checkpoint_bytes=sum(int(c.get("bytes") or 0) for c in result.get("checkpoints", [])),
        lost_steps=lost_steps,
        final_step=result.get("final_step"),
        sweep=sweep,
    )
    CostLedger(Path(home_root) / "cost").record(cost)
    return cost
