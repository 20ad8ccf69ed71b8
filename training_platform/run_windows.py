"""Runs with a `cost.deadline` wait for their cheapest window, as sweeps do.

`tp train` records such a run here instead of queueing it when its cheapest start before the deadline
is later than now (`--now` starts it at once); the hourly `run_window_schedule` submits each run whose
window has opened, once: its run key is the run and its window (`$TP_HOME/windows/<run_id>.json` holds
the spec, the tags and the window).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.windows import CostWindow, cost_window_for
from training_platform.identifiers import check_run_id, contained
from training_platform.spec import TrainSpec, parse_spec

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
        self.root = Path(home_root) / WINDOWS_DIR

    def path(self, run_id: str) -> Path:
        return contained(self.root, f"{check_run_id(run_id)}.json")

    def enqueue(self, run_id: str, spec: TrainSpec, tags: dict[str, str], window: CostWindow) -> WaitingRun:
        record = {"spec": spec.model_dump(mode="json"), "tags": tags, "window": window.as_dict()}
        self._write(run_id, record)
        return self.get(run_id)  # type: ignore[return-value]

    def get(self, run_id: str) -> WaitingRun | None:
        path = self.path(run_id)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        spec = parse_spec(record["spec"], source=str(path))
        return WaitingRun(run_id, spec, record["tags"], record["window"])

    def all(self) -> list[WaitingRun]:
        if not self.root.is_dir():
            return []
        return [w for p in sorted(self.root.glob("*.json")) if (w := self.get(p.stem)) is not None]

    def due(self, at: datetime) -> list[WaitingRun]:
        """Runs whose window has opened (or passed: a late release still beats missing the deadline)."""
        return [w for w in self.all() if at >= w.start]

    def _write(self, run_id: str, record: dict[str, Any]) -> None:
        """Atomically: the schedule reads these files while `tp train` writes them."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(run_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
