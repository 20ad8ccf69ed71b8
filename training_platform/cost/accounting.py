"""What a run cost: compute by capacity type, checkpoint storage, data transfer, and work lost to preemptions.

The cost ledger (``$TP_HOME/cost/ledger.jsonl``, or a table of the platform's database: backends.py) holds
one row per attempt of every run (charges.py: wall time x price, whatever the attempt's outcome) and one per
finished run's checkpoint storage; totals per team, sweep, run and day, and team budgets, are sums over it.
"""

from __future__ import annotations

import fcntl
import json
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from training_platform.cost.prices import CostError, PriceModel, load_price_model
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
    total_usd: float
    extra: dict = field(default_factory=dict)


def run_cost(
    spec: TrainSpec,
    run_id: str,
    train_seconds: float,
    *,
    checkpoint_bytes: int = 0,
    retention_days: float = 30.0,
    transfer_bytes: int = 0,
    sweep: str | None = None,
    ended: datetime | None = None,
    model: PriceModel | None = None,
) -> RunCost:
    """Price compute hours at the hour-of-week price of when they ran, plus storage and transfer (the storage
    row of a finished run; its attempts are priced one by one in charges.py, with their lost work apart)."""
    model = model or load_price_model()
    ended = (ended or datetime.now(UTC)).astimezone(UTC)
    res = spec.resources
    units = res.nodes * (res.gpus_per_node if res.gpus_per_node else res.procs_per_node)
    gpu_type = res.gpu_type if res.gpus_per_node else None
    hours = max(train_seconds, 0.0) / 3600.0
    curve = model.curve(gpu_type, res.spot, None)
    compute = window_cost(curve, ended - timedelta(seconds=train_seconds), hours, units) if hours else 0.0
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
        total_usd=compute + storage + transfer,
    )


class LedgerQueries(ABC):
    """What every ledger answers from its rows: `records` and `record_once` are the ledger's own."""

    @abstractmethod
    def records(
        self, team: str | None = None, since: datetime | None = None, sweep: str | None = None, run: str | None = None
    ) -> list[dict]: ...

    @abstractmethod
    def record_once(self, rows: list[dict]) -> list[dict]:
        """Write the rows whose key is not in the ledger yet; returns those written."""

    def record(self, cost: RunCost) -> None:
        self.record_once([{"key": f"{cost.run_id}#run", **asdict(cost)}])

    def keys(self) -> set[str]:
        return {row_key(row) for row in self.records()}

    def spend(self, team: str, since: datetime) -> float:
        return sum(r["total_usd"] for r in self.records(team=team, since=since))

    def totals(self, key: str, since: datetime | None = None, team: str | None = None) -> dict[str, dict[str, float]]:
        """Sums per team, sweep, run or day (UTC): runs, attempts, hours, compute, badput, storage, total, goodput."""
        if key not in GROUPS:
            raise CostError(f"cannot group spend by {key!r}; use one of: {', '.join(GROUPS)}")
        rows: dict[str, list[dict]] = defaultdict(list)
        for r in self.records(team=team, since=since):
            rows[GROUPS[key](r) or "-"].append(r)
        return {group: summed(members) for group, members in rows.items()}


class CostLedger(LedgerQueries):
    """Append-only JSON lines, one per charge: each attempt of a run (its compute), each finished run's storage.

    A row's `key` names what it charges (`<run id>#<attempt>`, `<checkpoint key>#storage`); `record_once`
    appends only keys not yet in the ledger, under a lock, so a charge is written once whoever settles it.
    """

    def __init__(self, root: Path):
        self.path = Path(root) / LEDGER

    def record_once(self, rows: list[dict]) -> list[dict]:
        """Append the rows whose key is not in the ledger yet; returns those written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released on close; settlers in other processes wait here
            handle.seek(0)
            charged = {row_key(row) for row in _parse(handle.read())}
            new = [row for row in rows if row_key(row) not in charged]
            if new:
                handle.write("".join(json.dumps(row) + "\n" for row in new))
        return new

    def records(
        self, team: str | None = None, since: datetime | None = None, sweep: str | None = None, run: str | None = None
    ) -> list[dict]:
        if not self.path.is_file():
            return []
        return [r for r in _parse(self.path.read_text()) if matches(r, team, since, sweep, run)]


def matches(
    row: dict, team: str | None = None, since: datetime | None = None, sweep: str | None = None, run: str | None = None
) -> bool:
    return (
        (team is None or row["team"] == team)
        and (sweep is None or row.get("sweep") == sweep)
        and (run is None or row["run_id"] == run)
        and (since is None or datetime.fromisoformat(row["at"]) >= since)
    )


GROUPS = {
    "team": lambda r: r["team"],
    "sweep": lambda r: r.get("sweep"),
    "run": lambda r: r["run_id"],
    "day": lambda r: datetime.fromisoformat(r["at"]).astimezone(UTC).date().isoformat(),
}
SUMMED = ("accelerator_hours", "wall_seconds", "useful_seconds", "compute_usd", "lost_work_usd", "badput_usd",
          "storage_usd", "transfer_usd", "total_usd")


def summed(rows: list[dict]) -> dict[str, float]:
    """Totals of ledger rows; goodput is effective training time over the wall time of the attempts charged."""
    out = {name: sum(float(r.get(name) or 0.0) for r in rows) for name in SUMMED}
    out["runs"] = len({r["run_id"] for r in rows})
    out["attempts"] = sum(r.get("kind") == "attempt" for r in rows)
    out["lost_steps"] = sum(int(r.get("lost_steps") or 0) for r in rows)
    out["goodput"] = out["useful_seconds"] / out["wall_seconds"] if out["wall_seconds"] else None
    return out


def row_key(row: dict) -> str:
    return row.get("key") or f"{row['run_id']}#run"  # rows written before keys: one per finished run


def _parse(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def month_start(at: datetime | None = None) -> datetime:
    at = (at or datetime.now(UTC)).astimezone(UTC)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
