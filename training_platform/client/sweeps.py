"""Sweeps through the server: submit one, follow its trials until the sweep sensor records its results."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from training_platform.client.graphql import FINISHED, PlatformClient
from training_platform.client.runs import DaemonWatch
from training_platform.runs.specs import queue_tags
from training_platform.spec.submission import PARTITION_TAG, SWEEP_JOB, SWEEP_TAG
from training_platform.sweeps.spec import SweepSpec

SWEEPS = "sweeps"


@dataclass
class SweepProgress:
    sweep: str
    state: str  # STARTING, QUEUED (waits for its window), RUNNING, FINISHED or FAILED
    trials: dict[str, int] = field(default_factory=dict)  # Dagster run status -> trial runs
    summary: dict[str, Any] | None = None
    error: str | None = None


def submit_sweep(client: PlatformClient, sweep: SweepSpec, now: bool) -> str:
    """Queue the run that records and starts the sweep; its Dagster run id."""
    client.add_partition(sweep.name, SWEEPS)
    base = sweep.base_spec
    config = {"sweep_spec": sweep.model_dump_json(), "now": now}
    tags = queue_tags(base.team, base.resources.priority, owner=base.owner, **{SWEEP_TAG: sweep.name})
    return client.submit(SWEEP_JOB, tags={**tags, PARTITION_TAG: sweep.name}, run_config={
        "ops": {"sweep": {"config": config}}
    })


def follow_sweep(
    client: PlatformClient, sweep: str, dagster_run_id: str, poll_s: float = 2.0
) -> Iterator[SweepProgress]:
    """The sweep's progress until its start run fails, it waits for its window, or its results are recorded."""
    daemon = DaemonWatch(client)
    while True:
        run = client.run(dagster_run_id)
        if run is None or run.status not in FINISHED:
            yield SweepProgress(sweep, "STARTING")
        elif run.status != "SUCCESS":
            yield SweepProgress(sweep, "FAILED", error=client.failure(run.id).message)
            return
        else:
            started = client.materializations(dagster_run_id).get("sweep", {})
            if started.get("state") == "QUEUED":
                yield SweepProgress(sweep, "QUEUED", summary=started)
                return
            finished = _finished(client, sweep, after=run.created)
            if finished is not None:
                yield SweepProgress(sweep, "FINISHED", _trial_counts(client, sweep), summary=finished)
                return
            problem = daemon.down()  # its trials are submitted by the daemon's sweep sensor
            yield SweepProgress(sweep, f"RUNNING ({problem})" if problem else "RUNNING", _trial_counts(client, sweep))
        time.sleep(poll_s)


def _trial_counts(client: PlatformClient, sweep: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in client.runs(tags={SWEEP_TAG: sweep}, limit=1000):
        if run.trains:
            counts[run.status] = counts.get(run.status, 0) + 1
    return counts


def _finished(client: PlatformClient, sweep: str, after: float) -> dict[str, Any] | None:
    """The results the sweep sensor recorded for this sweep since `after` (None while it runs)."""
    for metadata, timestamp in client.asset_materializations("sweep", sweep, limit=5):
        if timestamp >= after and metadata.get("state") == "FINISHED":
            return metadata.get("summary")
    return None
