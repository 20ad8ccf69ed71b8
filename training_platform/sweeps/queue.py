"""Sweeps waiting for their cost window: one JSON file each under `$TP_HOME/sweeps/queue/`.

`tp sweep` queues a sweep whose cheapest window starts later; the hourly release schedule starts
those whose window has opened. The file holds the validated sweep, its window and its state.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.windows import CostWindow, cost_window_for
from training_platform.sweeps.spec import SweepSpec, parse_sweep


@dataclass(frozen=True)
class QueuedSweep:
    sweep: SweepSpec
    window: dict[str, Any]
    state: str  # QUEUED, RELEASED

    @property
    def start(self) -> datetime:
        return datetime.fromisoformat(self.window["start"])

    @property
    def end(self) -> datetime:
        return datetime.fromisoformat(self.window["end"])

    def due(self, at: datetime) -> bool:
        """Inside the window (or past its start: a late release still beats missing the deadline)."""
        return self.state == "QUEUED" and at >= self.start


class SweepQueue:
    def __init__(self, home_root: Path):
        self.root = Path(home_root) / "sweeps" / "queue"

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def enqueue(self, sweep: SweepSpec, window: CostWindow) -> QueuedSweep:
        self.root.mkdir(parents=True, exist_ok=True)
        record = {"sweep": sweep.model_dump(mode="json"), "window": window.as_dict(), "state": "QUEUED"}
        tmp = self.path(sweep.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.path(sweep.name))
        return self.get(sweep.name)  # type: ignore[return-value]

    def get(self, name: str) -> QueuedSweep | None:
        path = self.path(name)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        return QueuedSweep(parse_sweep(record["sweep"], str(path)), record["window"], record["state"])

    def all(self) -> list[QueuedSweep]:
        if not self.root.is_dir():
            return []
        return [q for p in sorted(self.root.glob("*.json")) if (q := self.get(p.stem)) is not None]

    def due(self, at: datetime) -> list[QueuedSweep]:
        return [q for q in self.all() if q.due(at)]

    def mark(self, name: str, state: str) -> None:
        path = self.path(name)
        if path.is_file():
            record = json.loads(path.read_text())
            record["state"] = state
            path.write_text(json.dumps(record, indent=2))


# Dagster's queued run coordinator runs higher `dagster/priority` first (see deploy/dagster/dagster.yaml).
PRIORITY_TAGS = {"low": "-10", "normal": "0", "high": "10"}


def queue_tags(team: str, priority: str, **extra: str) -> dict[str, str]:
    """Tags that place a run in the Dagster queue: per-team concurrency (`team`) and priority."""
    return {"team": team, "dagster/priority": PRIORITY_TAGS[priority], **extra}


def sweep_window(sweep: SweepSpec, now: datetime | None = None) -> CostWindow:
    """The cheapest window for the whole sweep before its deadline (a week ahead when it has none).

    Length: the base spec's expected hours (1 h when unset) per wave of parallel trials; GPUs: the
    base spec's GPUs (or processes, on CPU) times the parallel trials.
    """
    base = sweep.base_spec
    res = base.resources
    units = res.nodes * (res.gpus_per_node or res.procs_per_node) * sweep.limits.parallel_trials
    waves = math.ceil(sweep.limits.max_trials / sweep.limits.parallel_trials)
    hours = (base.cost.expected_hours or 1.0) * waves
    gpu_hours = sweep.limits.max_gpu_hours or hours * units
    return cost_window_for(
        gpu_hours,
        res.gpu_type if res.gpus_per_node else None,
        sweep.deadline,
        res.spot,
        gpus=units,
        now=now or datetime.now(UTC),
    )


def waits_for_window(sweep: SweepSpec, window: CostWindow, now: datetime) -> bool:
    """A sweep with a deadline waits for its cheapest window; one without starts now.

    Without a deadline the user has not said how long the results may take, so saving a few cents
    by starting hours later would be a surprise; the window is still reported beside the run.
    """
    return sweep.deadline is not None and window.start > now + timedelta(minutes=1)
