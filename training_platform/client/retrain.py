"""`tp retrain` through the server: one backfill of the days' snapshots, each starting its day's run.

The backfill's runs and the training runs they start share a `tp/serial` tag, so the days train one
after the other in day order (the promotion gate compares each day with the champion before it).
A day whose run trained before is not trained again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from training_platform.client.graphql import PlatformClient
from training_platform.client.runs import Progress, follow
from training_platform.runs.retraining import day_run_id, lineage_digest
from training_platform.runs.specs import spec_tags
from training_platform.spec import TrainSpec
from training_platform.spec.submission import BACKFILL_TAG, PARTITION_TAG, SERIAL_TAG, snapshot_run_config

BACKFILL_START_WAIT_S = 120.0


@dataclass(frozen=True)
class Retrain:
    backfill_id: str | None
    days: list[date]
    trained_before: dict[str, str]  # day -> the Dagster run that trained it


def launch_retrain(client: PlatformClient, spec: TrainSpec, days: list[date]) -> Retrain:
    """Backfill the snapshots of the days not trained yet; each passed snapshot starts its day's run."""
    trained: dict[str, str] = {}
    for day in days:
        finished = [r for r in client.attempts(day_run_id(spec, day)) if r.status == "SUCCESS"]
        if finished:
            trained[day.isoformat()] = finished[0].id
    todo = [d.isoformat() for d in days if d.isoformat() not in trained]
    if not todo:
        return Retrain(None, days, trained)
    serial = f"retrain-{spec.name}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    backfill_id = client.launch_backfill(
        "dataset_snapshot", todo, tags=spec_tags(spec, **{SERIAL_TAG: serial}),
        run_config=snapshot_run_config(spec.dataset.source, then_train=spec, dataset=spec.dataset),
    )
    return Retrain(backfill_id, days, trained)


def follow_retrain(client: PlatformClient, spec: TrainSpec, retrain: Retrain) -> Iterator[dict[str, Any]]:
    """Each day's outcome, in day order, as it ends."""
    for day in retrain.days:
        run_id = day_run_id(spec, day)
        line: dict[str, Any] = {"day": day.isoformat(), "run_id": run_id}
        if day.isoformat() in retrain.trained_before:
            yield line | {"status": "EXISTS"} | day_models(client, retrain.trained_before[day.isoformat()])
            continue
        snapshot = _backfill_run(client, retrain.backfill_id, day.isoformat())
        if snapshot is None:
            yield line | {"status": "FAILED", "error": f"backfill {retrain.backfill_id} started no run for {day}"}
            continue
        final: Progress | None = None
        for final in follow(client, run_id, snapshot):  # noqa: B007 - the last one is the outcome
            pass
        assert final is not None
        if final.phase != "SUCCEEDED" or final.dagster_run is None:
            yield line | {"status": "FAILED", "error": final.error}
            continue
        yield line | {"status": "SUCCEEDED", "dagster_run_id": final.dagster_run.id} | day_models(
            client, final.dagster_run.id
        )


def _backfill_run(client: PlatformClient, backfill_id: str | None, day: str) -> str | None:
    deadline = time.monotonic() + BACKFILL_START_WAIT_S
    while time.monotonic() < deadline:
        runs = client.runs(tags={BACKFILL_TAG: backfill_id or "", PARTITION_TAG: day}, limit=5)
        if runs:
            return runs[-1].id  # the first one the backfill started for the day
        time.sleep(1.0)
    return None


def day_models(client: PlatformClient, dagster_run_id: str) -> dict[str, Any]:
    """The day's model version, gate outcome and lineage key, from the run's materializations."""
    assets = client.materializations(dagster_run_id)
    trained, registered = assets.get("training_run", {}), assets.get("registered_model", {})
    lineage = trained.get("lineage") or {}
    return {
        "model_name": registered.get("model_name"),
        "model_version": registered.get("model_version"),
        "promoted": registered.get("promoted"),
        "snapshot_id": lineage.get("snapshot_id", ""),
        "lineage_key": lineage_digest(lineage),
        "lineage": lineage,
    }
