"""Retraining by day: one training run per spec and day, named `<spec name>-<YYYY-MM-DD>`.

Used by the nightly schedule, the snapshot backfill sensor and `tp retrain`, so all three name
and register a day's run the same way (and a day is never trained twice by accident).
"""

from __future__ import annotations

import hashlib
from datetime import date, timedelta

from training_platform.paths import PlatformHome
from training_platform.runs.specs import is_registered, register_run
from training_platform.spec import TrainSpec, canonical_json, parse_spec


def day_run_id(spec: TrainSpec, day: date) -> str:
    """The training_runs partition of `spec` retrained on the data as of `day`."""
    return f"{spec.name}-{day.isoformat()}"


def day_spec(spec: TrainSpec, day: date) -> TrainSpec:
    """`spec` reading the snapshot as of `day` (a pinned snapshot id is dropped: the day decides)."""
    dataset = {**spec.dataset.model_dump(mode="json"), "as_of": day.isoformat(), "snapshot_id": None}
    return parse_spec({**spec.model_dump(mode="json"), "dataset": dataset}, source=f"{spec.name} as of {day}")


def register_day_run(home: PlatformHome, spec: TrainSpec, day: date) -> str:
    """Record the day's spec under its run id (once: a registered day keeps the spec it was created with)."""
    run_id = day_run_id(spec, day)
    if not is_registered(home, run_id):
        register_run(home, day_spec(spec, day), run_id)
    return run_id


def days_between(first: date, last: date) -> list[date]:
    """Every day from `first` to `last`, both included."""
    return [first + timedelta(days=offset) for offset in range((last - first).days + 1)]


def lineage_digest(lineage: dict) -> str:
    """A short, stable name for a lineage key (12 hex characters of its canonical JSON's sha256)."""
    return hashlib.sha256(canonical_json(lineage).encode()).hexdigest()[:12]
