"""`tp status`: queued and running runs with estimated wait, progress, utilization and cost so far.

Pure: the caller lists the run records (the Dagster instance merged with run telemetry).
The wait estimate is deliberately simple and says so: runs ahead in the queue, divided over
the slots now in use, times the median duration of recent successful runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from training_platform.telemetry.records import RunRecord, latest_per_run


@dataclass(frozen=True)
class StatusRow:
    run_id: str
    team: str
    status: str
    waited_s: float | None
    estimated_wait_s: float | None
    progress: float | None
    utilization_pct: float | None
    cost_usd: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def median_duration(runs: list[RunRecord]) -> float | None:
    durations = [
        r.ended_at - r.started_at
        for r in runs
        if r.status == "SUCCEEDED" and r.started_at is not None and r.ended_at is not None
    ]
    return statistics.median(durations) if durations else None


def _remaining(run: RunRecord, typical: float, now: float) -> float:
    if run.progress:
        elapsed = now - run.started_at if run.started_at else 0.0
        return max(0.0, elapsed / run.progress - elapsed)
    return max(0.0, typical - (now - run.started_at if run.started_at else 0.0))


def status_rows(records: list[RunRecord], now: float, team: str | None = None) -> list[StatusRow]:
    """Running runs first, then queued ones in queue order; every team's runs count for the wait."""
    runs = latest_per_run(records)
    running = [r for r in runs if r.status == "RUNNING"]
    queued = sorted((r for r in runs if r.status == "QUEUED"), key=lambda r: r.queued_at or now)
    typical = median_duration(runs)
    rows = []
    for run in running:
        rows.append(
            StatusRow(
                run.run_id,
                run.team,
                run.status,
                (run.started_at - run.queued_at) if run.started_at and run.queued_at else None,
                0.0,
                round(run.progress, 4) if run.progress is not None else None,
                run.utilization[-1][1] if run.utilization else None,
                run.cost_usd,
            )
        )
    slots = max(len(running), 1)
    soonest = min((_remaining(r, typical, now) for r in running), default=0.0) if typical else None
    for position, run in enumerate(queued):
        estimate = None
        if typical is not None and soonest is not None:
            estimate = (soonest if running else 0.0) + math.floor(position / slots) * typical
        rows.append(
            StatusRow(
                run.run_id,
                run.team,
                run.status,
                now - run.queued_at if run.queued_at else None,
                round(estimate, 1) if estimate is not None else None,
                None,
                None,
                run.cost_usd,
            )
        )
    return [r for r in rows if team is None or r.team == team]
