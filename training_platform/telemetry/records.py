"""Run records: what alerts, `tp status` and the Prometheus endpoint know about a run.

The worker keeps `telemetry.json` in the run directory up to date while it trains (progress,
utilization samples, cost so far) and writes the final figures at the end. Queue times and
final states come from the orchestrator (Dagster), which the caller merges in.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from training_platform.paths import PlatformHome
from training_platform.runs.backends import open_run_registry
from training_platform.runs.layout import TELEMETRY_FILE

FINISHED = ("SUCCEEDED", "FAILED", "CANCELED", "PREEMPTED")
# A Dagster run's status (its name, as the instance and the GraphQL API both spell it) as a record's.
ORCHESTRATOR_STATES = {
    "QUEUED": "QUEUED",
    "NOT_STARTED": "QUEUED",
    "STARTING": "QUEUED",
    "STARTED": "RUNNING",
    "SUCCESS": "SUCCEEDED",
    "FAILURE": "FAILED",
    "CANCELING": "CANCELED",
    "CANCELED": "CANCELED",
}


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    family: str = ""
    """spec.name: runs of a family (or a sweep) are compared with each other"""
    team: str = ""
    status: str = "UNKNOWN"
    """QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELED, PREEMPTED or UNKNOWN"""
    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    device: str = "cpu"
    step: int = 0
    max_steps: int | None = None
    utilization: tuple[tuple[float, float], ...] = ()
    """(epoch seconds, utilization %) samples"""
    data_wait_fraction: float | None = None
    checkpoint_overhead: float | None = None
    cost_usd: float | None = None
    cost_per_hour_usd: float | None = None
    sweep: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def progress(self) -> float | None:
        return self.step / self.max_steps if self.max_steps else None

    @property
    def mean_utilization(self) -> float | None:
        return sum(u for _, u in self.utilization) / len(self.utilization) if self.utilization else None

    def merged(self, **changes: object) -> RunRecord:
        """This record with the non-None `changes` applied (orchestrator facts over worker facts)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def write_telemetry(run_dir: Path, payload: dict, name: str = TELEMETRY_FILE) -> None:
    """Atomically replace the run's telemetry file (readers never see half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, run_dir / name)


def read_telemetry(run_dir: Path) -> dict | None:
    path = run_dir / TELEMETRY_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def record_from_telemetry(run_id: str, payload: dict | None) -> RunRecord:
    if not payload:
        return RunRecord(run_id=run_id)
    figures = payload.get("figures") or {}
    return RunRecord(
        run_id=run_id,
        family=payload.get("family", ""),
        team=payload.get("team", ""),
        status=payload.get("status", "UNKNOWN"),
        started_at=payload.get("started_at"),
        ended_at=payload.get("ended_at"),
        device=payload.get("device", "cpu"),
        step=int(payload.get("step", 0)),
        max_steps=payload.get("max_steps"),
        utilization=tuple((float(t), float(u)) for t, u in payload.get("utilization", [])),
        data_wait_fraction=figures.get("data_wait_fraction", payload.get("data_wait_fraction")),
        checkpoint_overhead=figures.get("checkpoint_overhead", payload.get("checkpoint_overhead")),
        cost_usd=figures.get("cost_usd", payload.get("cost_usd")),
        cost_per_hour_usd=figures.get("cost_per_hour_usd", payload.get("cost_per_hour_usd")),
        sweep=payload.get("sweep"),
    )


def load_run_record(home: PlatformHome, run_id: str) -> RunRecord:
    """What the run's own files say (telemetry, spec); QUEUED when it has a spec but never started."""
    run_dir = home.run_dir(run_id)
    record = record_from_telemetry(run_id, read_telemetry(run_dir))
    if not record.family:
        try:
            spec = json.loads(open_run_registry(home).get(run_id) or "")
            record = record.merged(
                family=spec.get("name"),
                team=spec.get("team"),
                max_steps=spec.get("training", {}).get("max_steps"),
                status="QUEUED" if record.status == "UNKNOWN" else None,
            )
        except (json.JSONDecodeError, AttributeError):  # never registered, or not a spec
            pass
    return record


def orchestrated_record(
    home: PlatformHome, run_id: str, dagster_status: str, created: float, ended: float | None, team_tag: str,
    dagster_run_id: str,
) -> RunRecord:
    """One Dagster run of a platform run: the orchestrator's facts over the run's own telemetry."""
    on_disk = load_run_record(home, run_id)
    # The worker's telemetry belongs to this Dagster run only if it started after the run was created.
    if on_disk.started_at is not None and on_disk.started_at < created:
        on_disk = RunRecord(run_id=run_id, family=on_disk.family, team=on_disk.team, max_steps=on_disk.max_steps)
    status = ORCHESTRATOR_STATES.get(dagster_status, "UNKNOWN")
    return on_disk.merged(
        status=status,
        queued_at=created,
        ended_at=ended if status in ("SUCCEEDED", "FAILED", "CANCELED") else None,
        team=on_disk.team or team_tag or None,
        extra={"dagster_run_id": dagster_run_id},
    )


def load_run_records(home: PlatformHome) -> list[RunRecord]:
    """Every run this home ran an attempt of, or the registry knows."""
    ran = {d.name for d in home.runs.iterdir() if d.is_dir()} if home.runs.is_dir() else set()
    return [load_run_record(home, run_id) for run_id in sorted(ran | set(open_run_registry(home).specs()))]


def latest_per_run(records: list[RunRecord]) -> list[RunRecord]:
    """The first record of each run id (callers pass records newest first: the newest attempt wins)."""
    seen: dict[str, RunRecord] = {}
    for record in records:
        seen.setdefault(record.run_id, record)
    return list(seen.values())
