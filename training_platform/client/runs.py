"""Platform runs through the server: submit a training run, follow it to its end, summarize it.

A platform run is a `training_runs` partition. Submitting one queues either its training run, or,
when its data source has no snapshot for the day yet, a snapshot run tagged to train it (the
server's `retraining_sensor` starts the training run once the snapshot passes its expectations).
Following it walks every Dagster run the platform run goes through: the snapshot, the first attempt,
the resume after a preemption (started by the preemption sensor), a retry (the failure sensor), the run that takes
a job over when the run following it went down (the preemption sensor).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from training_platform.client.graphql import ClientError, DagsterRun, PlatformClient
from training_platform.runs.specs import spec_tags
from training_platform.spec import TrainSpec
from training_platform.spec.submission import (
    LEFT_JOB_TAG,
    PARTITION_TAG,
    RETRY_TAG,
    RUN_ASSETS,
    SNAPSHOT_JOB,
    THEN_TRAIN_TAG,
    TRAINING_JOB,
    retry_expected,
    run_assets,
    snapshot_run_config,
    training_run_config,
)

START_WAIT_S = 120.0
"""How long a passed snapshot, a preemption or a failure with retries left may wait for its next run."""
DAEMON_CHECK_S = 30.0


@dataclass(frozen=True)
class Progress:
    """Where a platform run is: `phase` is snapshot, queued, running, waiting or a final state."""

    run_id: str
    phase: str
    dagster_run: DagsterRun | None = None
    step: int | None = None
    max_steps: int | None = None
    metrics: str = ""
    cost_usd: float | None = None
    error: str | None = None
    error_class: str | None = None

    @property
    def final(self) -> bool:
        return self.phase in ("SUCCEEDED", "FAILED", "CANCELED")


@dataclass
class Submission:
    run_id: str
    dagster_run_id: str
    snapshot_first: bool
    tags: dict[str, str] = field(default_factory=dict)


def submit_training(client: PlatformClient, spec: TrainSpec, run_id: str, **extra_tags: str) -> Submission:
    """Queue the run (its snapshot first when the day has none that passed); nothing runs in this process."""
    tags = spec_tags(spec, **extra_tags)
    snapshot = submit_snapshot(client, spec, then_train=run_id, tags=tags)
    if snapshot is not None:
        return Submission(run_id, snapshot, snapshot_first=True, tags=tags)
    client.add_partition(run_id)
    dagster_run_id = client.submit(
        TRAINING_JOB, tags={**tags, PARTITION_TAG: run_id}, run_config=training_run_config(spec),
        assets=run_assets(tags),
    )
    return Submission(run_id, dagster_run_id, snapshot_first=False, tags=tags)


def submit_snapshot(
    client: PlatformClient, spec: TrainSpec, tags: dict[str, str], then_train: str | None = None
) -> str | None:
    """Queue the day's snapshot of the spec's source when there is none that passed its expectations (a
    spec pinned to a snapshot id needs none); tagged `then_train`, it starts that run once it passes.
    The snapshot run's Dagster run id, or None when the existing snapshot is used."""
    if spec.dataset.snapshot_id is not None or _has_snapshot(client, spec):
        return None
    day = (spec.dataset.as_of or datetime.now(UTC).date()).isoformat()
    chained = {THEN_TRAIN_TAG: then_train} if then_train else {}
    return client.submit(
        SNAPSHOT_JOB,
        tags={**tags, PARTITION_TAG: day, **chained},
        run_config=snapshot_run_config(
            spec.dataset.source, then_train=spec if then_train else None, dataset=spec.dataset
        ),
    )


def resubmit(client: PlatformClient, run_id: str, tags: dict[str, str], assets: tuple[str, ...] = RUN_ASSETS) -> str:
    """Queue another Dagster run of a registered platform run (a resume, or a reproduction of a finished one)."""
    return client.submit(TRAINING_JOB, tags={**tags, PARTITION_TAG: run_id}, assets=assets)


def _has_snapshot(client: PlatformClient, spec: TrainSpec) -> bool:
    """The day's snapshot of the spec's source exists and passed its expectations (then it is reused). Your own
    files may have changed since: their snapshot is always asked for (unchanged files cost a listing)."""
    if spec.dataset.is_file_source:
        return False
    day = (spec.dataset.as_of or datetime.now(UTC).date()).isoformat()
    for metadata, _ in client.asset_materializations("dataset_snapshot", day):
        if metadata.get("source") == spec.dataset.source:
            return bool(metadata.get("expectations_passed", True))
    return False


def follow(
    client: PlatformClient, run_id: str, dagster_run_id: str, retries_allowed: int = 0, poll_s: float = 1.0
) -> Iterator[Progress]:
    """The run's progress about every `poll_s` until it ends (the last item is final)."""
    current = client.run(dagster_run_id)
    waiting_since: float | None = None
    verdicts: dict[str, Progress] = {}  # a finished Dagster run's verdict never changes: asked for once
    daemon = DaemonWatch(client)
    while True:
        if current is None:
            yield Progress(run_id, "FAILED", error=f"Dagster run {dagster_run_id} is not on the server {client.url}; "
                           "list its runs with `tp runs`")
            return
        if not current.finished:
            waiting_since = None
            yield daemon.explain(_progress(run_id, current))
        else:
            newer = _newer_attempt(client, run_id, current)
            if newer is not None:
                current, waiting_since = newer, None
                continue
            if current.id not in verdicts:
                verdicts[current.id] = _verdict(client, run_id, current, retries_allowed)
            verdict = verdicts[current.id]
            if verdict.final:
                yield verdict
                return
            waiting_since = waiting_since or time.monotonic()
            if time.monotonic() - waiting_since > START_WAIT_S:
                problem = daemon.down()
                error = f"{verdict.error}; nothing continued it within {START_WAIT_S:.0f} s"
                yield Progress(run_id, "FAILED", current, error=error + (f" ({problem})" if problem else ""))
                return
            yield daemon.explain(verdict)
        time.sleep(poll_s)
        current = client.run(current.id)


class DaemonWatch:
    """Says why a run waits when the server's daemon (queue, sensors) does not run; asked every DAEMON_CHECK_S."""

    def __init__(self, client: PlatformClient):
        self.client = client
        self._asked_at = time.monotonic()
        self._problem = ""

    def down(self) -> str:
        if time.monotonic() - self._asked_at >= DAEMON_CHECK_S:
            self._asked_at = time.monotonic()
            stopped = self.client.daemons_down()
            self._problem = (
                f"the platform's daemon is not running ({', '.join(stopped)}): start it with `tp server start`"
                if stopped else ""
            )
        return self._problem

    def explain(self, progress: Progress) -> Progress:
        waiting = progress.phase == "queued" or progress.phase.startswith(("waiting", "preempted", "failed:"))
        problem = self.down() if waiting else ""
        return replace(progress, phase=f"{progress.phase} ({problem})") if problem else progress


def wait_for(client: PlatformClient, dagster_run_id: str, poll_s: float = 1.0) -> DagsterRun:
    """The Dagster run once it finished."""
    while (run := client.run(dagster_run_id)) is None or not run.finished:
        if run is None:
            raise ClientError(f"Dagster run {dagster_run_id} is not on the server {client.url}")
        time.sleep(poll_s)
    return run


def continuation(client: PlatformClient, run_id: str, ended: DagsterRun, timeout_s: float = START_WAIT_S):
    """The Dagster run that continues a platform run whose last one ended (the training run after its snapshot,
    the resume after a preemption), once the server starts it; None when nothing continues it."""
    if _verdict(client, run_id, ended, retries_allowed=0).final:
        return None
    deadline = time.monotonic() + timeout_s
    while (newer := _newer_attempt(client, run_id, ended)) is None and time.monotonic() < deadline:
        time.sleep(1.0)
    return newer


def _newer_attempt(client: PlatformClient, run_id: str, current: DagsterRun) -> DagsterRun | None:
    """A training run of this platform run created after `current` (the next attempt), the oldest first."""
    attempts = [r for r in client.attempts(run_id) if r.created > current.created]
    return min(attempts, key=lambda r: r.created) if attempts else None


def _verdict(client: PlatformClient, run_id: str, run: DagsterRun, retries_allowed: int) -> Progress:
    """A finished Dagster run: the platform run's end, or a wait for the run that continues it."""
    if run.status == "SUCCESS":
        if not run.trains:  # the snapshot the run waited for
            return Progress(run_id, "waiting for the training run to start", run)
        return Progress(run_id, "SUCCEEDED", run)
    if run.status == "CANCELED":
        return Progress(run_id, "CANCELED", run, error="the run was cancelled")
    if not run.trains:  # a snapshot that failed its expectations: say which, not Dagster's "blocking check failed"
        failed = [check for check in client.check_results(run.id) if not check.passed]
        if failed:
            return Progress(run_id, "FAILED", run, error=f"the dataset snapshot did not pass: {failed[0].description}")
    if run.trains and LEFT_JOB_TAG in run.tags:
        return Progress(
            run_id,
            "waiting for the run that takes over its job (the run went down, the job goes on)",
            run,
            error=f"Dagster run {run.id} went down while job {run.tags[LEFT_JOB_TAG]} went on",
        )
    failure = client.failure(run.id)
    if run.trains and failure.metadata.get("preempted"):
        return Progress(run_id, "preempted: waiting for the resume", run, error=failure.message)
    retries_used = sum(RETRY_TAG in r.tags for r in client.attempts(run_id))
    if run.trains and retry_expected(failure.error_class, retries_used, retries_allowed):
        return Progress(run_id, "failed: waiting for the retry", run, error=failure.message)
    return Progress(run_id, "FAILED", run, error=failure.message, error_class=failure.error_class)


def _progress(run_id: str, run: DagsterRun) -> Progress:
    if not run.trains:
        return Progress(run_id, "snapshot", run)
    tags = run.tags
    phase = {"STARTED": "running", "STARTING": "starting", "CANCELING": "cancelling"}.get(run.status, "queued")
    return Progress(
        run_id,
        phase,
        run,
        step=int(tags["tp/step"]) if "tp/step" in tags else None,
        max_steps=int(tags["tp/max_steps"]) if "tp/max_steps" in tags else None,
        metrics=tags.get("tp/metrics", ""),
        cost_usd=float(tags["tp/cost_usd"]) if "tp/cost_usd" in tags else None,
    )


def summary(client: PlatformClient, run_id: str, final: Progress) -> dict[str, Any]:
    """What `tp train --json` ends with: the run's state and, when it succeeded, its lineage and model."""
    dagster_run = final.dagster_run
    result: dict[str, Any] = {"run_id": run_id, "status": final.phase, "dagster_run_id": dagster_run and dagster_run.id}
    if final.phase != "SUCCEEDED" or dagster_run is None:
        failed = client.failure(dagster_run.id).metadata if dagster_run is not None and dagster_run.trains else {}
        return result | {"error": final.error} | money(failed)
    assets = client.materializations(dagster_run.id)
    trained = assets.get("training_run", {})
    result |= {"preemptions": trained.get("preemptions", 0)} | money(trained) | {
        "status": trained.get("status", "SUCCEEDED"),
        "final_step": trained.get("final_step"),
        "final_weights_sha256": trained.get("final_weights_sha256"),
        "checkpoints": assets.get("checkpoints", {}).get("checkpoints", []),
        "mlflow_run_id": trained.get("mlflow_run_id"),
        "snapshot_id": trained.get("snapshot_id"),
        "tracking_uri": trained.get("tracking_uri"),
    }
    measured = assets.get("evaluated_model", {})  # test_<metric> for each metric the spec names
    result |= {k: round(v, 4) for k, v in measured.items() if k.startswith("test_") and isinstance(v, float)}
    if "registered_model" in assets:
        registered = assets["registered_model"]
        result |= {k: registered.get(k) for k in ("model_name", "model_version", "promoted", "gate")}
    return result


def money(metadata: dict[str, Any]) -> dict[str, Any]:
    """What a run's attempts cost, from its training_run metadata (assets/training.py): every attempt charged."""
    if "cost_total_usd" not in metadata:
        return {}
    return {
        "attempts": metadata.get("attempts"),
        "preemptions": metadata.get("preemptions", 0),
        "lost_steps": metadata.get("lost_steps", 0),
        "goodput": metadata.get("goodput"),
        "cost_usd": metadata["cost_total_usd"],
        "badput_usd": metadata.get("cost_badput_usd"),
        "lost_work_usd": metadata.get("cost_lost_work_usd"),
    }
