"""Runs with a `cost.deadline` wait for their cheapest window, as sweeps do.

`tp train` records such a run here instead of queueing it when its cheapest start before the deadline
is later than now (`--now` starts it at once); the hourly `run_window_schedule` submits each run whose
window has opened, once: its run key is the run and its window (its record holds the spec, the tags
and the window: documents.py, `$TP_HOME/windows/<run_id>.json` or a row of the platform's database).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.windows import CostWindow, cost_window_for
from training_platform.spec import TrainSpec, parse_spec
from training_platform.state.backends import open_documents

WINDOWS_DIR = "windows"


def run_window(spec: TrainSpec, now: datetime | None = None) -> CostWindow | None:
    """The cheapest window for the run before its deadline; None without a deadline (it starts now).

    Length: `cost.expected_hours` (1 h when unset); GPUs: the run's GPUs, or processes on CPU."""
    if spec.cost.deadline is None:
        return None
    res = spec.resources
    units = res.nodes * (res.gpus_per_node or res.procs_per_node)
    return cost_window_for(
        (spec.cost.expected_hours or 1.0) * units,
        res.gpu_type if res.gpus_per_node else None,
        spec.cost.deadline,
        res.spot,
        gpus=units,
        now=now or datetime.now(UTC),
    )


def waits_for_window(window: CostWindow | None, now: datetime) -> bool:
    return window is not None and window.start > now + timedelta(minutes=1)


@dataclass(frozen=True)
class WaitingRun:
    run_id: str
    spec: TrainSpec
    tags: dict[str, str]
    window: dict[str, Any]

    @property
    def start(self) -> datetime:
        return datetime.fromisoformat(self.window["start"])


class RunWindowQueue:
    def __init__(self, home_root: Path):
        self.records = open_documents(home_root, "run_window", WINDOWS_DIR)

    def enqueue(self, run_id: str, spec: TrainSpec, tags: dict[str, str], window: CostWindow) -> WaitingRun:
        self.records.put(run_id, {"spec": spec.model_dump(mode="json"), "tags": tags, "window": window.as_dict()})
        return self.get(run_id)  # type: ignore[return-value]

    def get(self, run_id: str) -> WaitingRun | None:
        record = self.records.get(run_id)
        if record is None:
            return None
        spec = parse_spec(record["spec"], source=self.records.where(run_id))
        return WaitingRun(run_id, spec, record["tags"], record["window"])

    def all(self) -> list[WaitingRun]:
        return [w for name in self.records.names() if (w := self.get(name)) is not None]

    def due(self, at: datetime) -> list[WaitingRun]:
        """Runs whose window has opened (or passed: a late release still beats missing the deadline)."""
        return [w for w in self.all() if at >= w.start]
