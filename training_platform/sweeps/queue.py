"""The platform's sweeps: one JSON file each under `$TP_HOME/sweeps/queue/`.

A sweep is QUEUED until its cost window opens (the hourly release schedule starts it), RUNNING while
the server's sweep sensor submits its trials, and FINISHED once none runs and none may start. The file
holds the validated sweep (its snapshot pinned once it runs), its window, its state and the sweep's
parent MLflow run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.windows import CostWindow, cost_window_for
from training_platform.identifiers import check_run_id, contained
from training_platform.sweeps.spec import SweepSpec, parse_sweep


@dataclass(frozen=True)
class QueuedSweep:
    sweep: SweepSpec
    window: dict[str, Any]
    state: str  # QUEUED, RUNNING, FINISHED
    parent_mlflow_run_id: str | None = None
    trials_until: datetime | None = None
    """the end of the cost window new trials are released in; None: no window"""

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
        # `name` may be a Dagster partition key typed in the UI: one plain name under the queue.
        return contained(self.root, f"{check_run_id(name, 'sweep name')}.json")

    def enqueue(self, sweep: SweepSpec, window: CostWindow) -> QueuedSweep:
        self.root.mkdir(parents=True, exist_ok=True)
        self._write(sweep.name, {"sweep": sweep.model_dump(mode="json"), "window": window.as_dict(), "state": "QUEUED"})
        return self.get(sweep.name)  # type: ignore[return-value]

    def start(self, sweep: SweepSpec, parent_mlflow_run_id: str, trials_until: datetime | None = None) -> None:
        """RUNNING, with the sweep as it runs (its snapshot pinned), its parent MLflow run, and the end of the
        window its trials are released in (None: no window, as with `tp sweep --now`)."""
        record = json.loads(self.path(sweep.name).read_text())
        record |= {"sweep": sweep.model_dump(mode="json"), "state": "RUNNING"}
        record["parent_mlflow_run_id"] = parent_mlflow_run_id
        record["trials_until"] = trials_until.isoformat() if trials_until else None
        self._write(sweep.name, record)

    def _write(self, name: str, record: dict[str, Any]) -> None:
        """Atomically: the sensor reads these files every few seconds."""
        tmp = self.path(name).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.path(name))

    def get(self, name: str) -> QueuedSweep | None:
        path = self.path(name)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        sweep = parse_sweep(record["sweep"], str(path))
        until = record.get("trials_until")
        return QueuedSweep(
            sweep,
            record["window"],
            record["state"],
            record.get("parent_mlflow_run_id"),
            datetime.fromisoformat(until) if until else None,
        )

    def all(self) -> list[QueuedSweep]:
        if not self.root.is_dir():
            return []
        return [q for p in sorted(self.root.glob("*.json")) if (q := self.get(p.stem)) is not None]

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """The sweep to this process alone while the block runs (an exclusive lock on its own lock file)."""
        with open(self.path(name).with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def due(self, at: datetime) -> list[QueuedSweep]:
        return [q for q in self.all() if q.due(at)]

    def mark(self, name: str, state: str) -> None:
        path = self.path(name)
        if path.is_file():
            self._write(name, json.loads(path.read_text()) | {"state": state})


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
