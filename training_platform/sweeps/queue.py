"""The platform's sweeps: one record each (documents.py: a JSON file under `$TP_HOME/sweeps/queue/`, or a row of
the platform's database).

A sweep is QUEUED until its cost window opens (the hourly release schedule starts it), RUNNING while
the server's sweep sensor submits its trials, and FINISHED once none runs and none may start. The record
holds the validated sweep (its snapshot pinned once it runs), its window, its state and the sweep's
parent MLflow run.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.windows import CostWindow, cost_window_for
from training_platform.errors import SpecError
from training_platform.state.backends import open_documents
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
        self.records = open_documents(home_root, "sweep", "sweeps/queue")

    def enqueue(self, sweep: SweepSpec, window: CostWindow) -> QueuedSweep:
        self.records.put(sweep.name, {"sweep": sweep.model_dump(mode="json"), "window": window.as_dict(),
                                      "state": "QUEUED"})
        return self.get(sweep.name)  # type: ignore[return-value]

    def start(self, sweep: SweepSpec, parent_mlflow_run_id: str, trials_until: datetime | None = None) -> None:
        """RUNNING, with the sweep as it runs (its snapshot pinned), its parent MLflow run, and the end of the
        window its trials are released in (None: no window, as with `tp sweep --now`)."""
        record = self.records.get(sweep.name)
        if record is None:
            raise SpecError(f"sweep {sweep.name!r} is not queued ({self.records.where(sweep.name)}); submit it with "
                            "`tp sweep SPEC`")
        record |= {"sweep": sweep.model_dump(mode="json"), "state": "RUNNING"}
        record["parent_mlflow_run_id"] = parent_mlflow_run_id
        record["trials_until"] = trials_until.isoformat() if trials_until else None
        self.records.put(sweep.name, record)

    def get(self, name: str) -> QueuedSweep | None:
        record = self.records.get(name)
        if record is None:
            return None
        sweep = parse_sweep(record["sweep"], self.records.where(name))
        until = record.get("trials_until")
        return QueuedSweep(
            sweep,
            record["window"],
            record["state"],
            record.get("parent_mlflow_run_id"),
            datetime.fromisoformat(until) if until else None,
        )

    def all(self) -> list[QueuedSweep]:
        return [q for name in self.records.names() if (q := self.get(name)) is not None]

    def locked(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The sweep to this process alone while the block runs (on a team's deployment, on any machine)."""
        return self.records.locked(name)

    def due(self, at: datetime) -> list[QueuedSweep]:
        return [q for q in self.all() if q.due(at)]

    def mark(self, name: str, state: str) -> None:
        record = self.records.get(name)
        if record is not None:
            self.records.put(name, record | {"state": state})


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
