"""Every attempt of every run charged once: wall time x units x the price of its capacity.

An attempt (attempts.py) is priced once it is closed, whatever its outcome: succeeded, preempted,
failed, killed or cancelled. Units are nodes x GPUs per node (processes per node on CPU); the price is
the hour-of-week price of its capacity (spot or on-demand) over the hours it ran. The work it lost
(steps a successor redoes) and its badput (paid time that trained nothing kept: start-up, restore,
checkpoint stalls, lost steps) are shown apart; goodput (ETTR) is effective training time over wall time.

Settling is idempotent: rows are keyed `<run id>#<attempt>` and `CostLedger.record_once` skips keys it
holds, so the training asset (after every launch) and the preemption sensor (every tick) may both settle
a run and each attempt is still charged exactly once.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_platform.cost.accounting import run_cost, summed
from training_platform.cost.attempts import AttemptSpan, attempt_spans
from training_platform.cost.backends import open_ledger
from training_platform.cost.prices import PriceModel, load_price_model
from training_platform.cost.windows import window_cost
from training_platform.runs.events import RunEvents
from training_platform.spec import TrainSpec, canonical_json


def units(spec: TrainSpec) -> int:
    """What a run pays for per hour: GPUs, or processes (one vCPU each) on CPU."""
    res = spec.resources
    return res.nodes * (res.gpus_per_node if res.gpus_per_node else res.procs_per_node)


def spec_key(spec: TrainSpec) -> str:
    """The fields that set a run's step time (not its length, seed or learning rate): estimates match on it."""
    shape = spec.model_dump(mode="json", include={"model", "entrypoint", "strategy", "deepspeed"})
    shape["batch_size"] = spec.training.batch_size
    shape["resources"] = spec.resources.model_dump(mode="json", include={"nodes", "procs_per_node", "gpus_per_node",
                                                                         "gpu_type"})
    return hashlib.sha256(canonical_json(shape).encode()).hexdigest()[:16]


def template_of(spec: TrainSpec) -> str:
    """The model template (and size), or the user's script or module: the coarser match for estimates."""
    if spec.entrypoint is not None:
        return f"script:{spec.entrypoint.script or spec.entrypoint.module}"
    return f"{spec.model.template}:{spec.model.size}"


def attempt_key(run_id: str, number: int) -> str:
    return f"{run_id}#{number}"


def charge(
    span: AttemptSpan, spec: TrainSpec, run_id: str, sweep: str | None = None, model: PriceModel | None = None
) -> dict[str, Any]:
    """The ledger row of one closed attempt."""
    model = model or load_price_model()
    spot = spec.resources.spot if span.spot is None else span.spot
    gpu_type = spec.resources.gpu_type if spec.resources.gpus_per_node else None
    count = units(spec)
    hours = span.wall_seconds / 3600.0
    started = datetime.fromtimestamp(span.started_at, UTC)
    curve = model.curve(gpu_type, spot)
    compute = window_cost(curve, started, hours, count) if hours else 0.0
    wall = span.wall_seconds
    return {
        "key": attempt_key(run_id, span.number),
        "kind": "attempt",
        "run_id": run_id,
        "attempt": span.number,
        "team": spec.team,
        "sweep": sweep,
        "spec_key": spec_key(spec),
        "template": template_of(spec),
        "gpu_type": gpu_type,
        "capacity": "spot" if spot else "on_demand",
        "outcome": span.outcome,
        "dagster_run_id": span.dagster_run_id,
        "started": started.isoformat(),
        "at": (started + timedelta(seconds=wall)).isoformat(),
        "wall_seconds": wall,
        "units": count,
        "usd_per_unit_hour": compute / (hours * count) if hours else model.base_price(gpu_type, spot),
        "accelerator_hours": hours * count,
        "steps": span.steps,
        "lost_steps": span.lost_steps,
        "useful_seconds": span.useful_seconds,
        "lost_seconds": span.lost_seconds,
        "compute_usd": compute,
        "lost_work_usd": compute * span.lost_seconds / wall if wall else 0.0,
        "badput_usd": compute * (wall - span.useful_seconds) / wall if wall else 0.0,
        "storage_usd": 0.0,
        "transfer_usd": 0.0,
        "total_usd": compute,
    }


def settle(
    home_root: Path, run_dir: Path, run_id: str, spec: TrainSpec, sweep: str | None = None,
    model: PriceModel | None = None,
) -> list[dict[str, Any]]:
    """Charge the run's closed attempts not charged yet; returns the rows written now."""
    return settle_spans(home_root, run_id, attempt_spans(RunEvents(run_dir).read()), spec, sweep, model)


def settle_spans(
    home_root: Path, run_id: str, spans: list[AttemptSpan], spec: TrainSpec, sweep: str | None = None,
    model: PriceModel | None = None,
) -> list[dict[str, Any]]:
    closed = [span for span in spans if span.closed]
    if not closed:
        return []
    model = model or load_price_model()
    rows = [charge(span, spec, run_id, sweep, model) for span in closed]
    return open_ledger(Path(home_root)).record_once(rows)


def run_money(home_root: Path, run_id: str) -> dict[str, Any]:
    """What the run has cost so far, over all its charged attempts (and its storage once finished)."""
    totals = summed(open_ledger(Path(home_root)).records(run=run_id))
    return {
        "attempts": totals["attempts"],
        "cost_total_usd": totals["total_usd"],
        "cost_compute_usd": totals["compute_usd"],
        "cost_badput_usd": totals["badput_usd"],
        "cost_lost_work_usd": totals["lost_work_usd"],
        "cost_storage_usd": totals["storage_usd"],
        "wall_seconds": totals["wall_seconds"],
        "goodput": totals["goodput"] if totals["goodput"] is not None else 0.0,
    }


def record_storage_cost(
    home_root: Path, spec: TrainSpec, run_id: str, storage_key: str, result: dict, sweep: str | None = None
) -> dict:
    """Charge a finished run's checkpoints once (30 days of their bytes); compute is charged per attempt
    (`charge`, above). `storage_key` is the checkpoint key, so a reproduction's own checkpoints are charged too."""
    cost = run_cost(
        spec, run_id, 0.0, checkpoint_bytes=sum(int(c.get("bytes") or 0) for c in result.get("checkpoints", [])),
        sweep=sweep,
    )
    row = {"key": f"{storage_key}#storage", "kind": "storage", **asdict(cost)}
    open_ledger(home_root).record_once([row])
    return row
