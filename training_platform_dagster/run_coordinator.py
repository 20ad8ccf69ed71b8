"""The run queue: Dagster's queued run coordinator, with every run of the platform tagged by its own spec.

Every run enters the queue here, whoever submits it: `tp`, the UI's Materialize button, a backfill,
a sensor's resume or retry, a sweep's trial, the nightly schedule. A run of the platform's jobs gets
the `team`, `owner` and `dagster/priority` of the spec it trains (or, for a sweep, of the sweep's base)
before it is queued, so per-team limits and priorities (deploy/dagster/dagster.yaml) hold for all of
them, and a submitter cannot take another team's slots by tagging its run with that team. A run of the
platform's jobs with no spec (a snapshot of new data) queues as team `platform`. The spec's team is
checked against the teams file when the run trains (preflight).

A run asked for by a signed-in person (the webserver's request, training_platform/server/auth.py: no other source
is trusted) is held to that person's rights (policy/rights.py): it runs only for a team that lists them, owned by
them (an admin's for the spec's `owner`), and a run of the platform's other jobs only for an admin, queued as
team `platform` whatever the client tagged; it is tagged with who asked (`tp/user`). A refused run is failed here
with the reason, before it is queued. Runs the platform starts itself (the daemon's sensors, schedules and
backfills) are its own.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dagster import DagsterRun, Field, QueuedRunCoordinator, SubmitRunContext

from training_platform.errors import PlatformError
from training_platform.paths import PlatformHome
from training_platform.policy.rights import check_may_run, check_may_run_job
from training_platform.runs.specs import load_run_spec, queue_tags, spec_from_json, spec_tags
from training_platform.server.auth import request_user
from training_platform.spec import TrainSpec
from training_platform.spec.submission import (
    PARTITION_TAG,
    RUN_ASSETS,
    SNAPSHOT_JOB,
    SWEEP_JOB,
    THEN_TRAIN_TAG,
    TRAINING_JOB,
    USER_TAG,
)
from training_platform.sweeps import SweepQueue, parse_sweep

UNATTRIBUTED_TEAM = "platform"
PLATFORM_ASSETS = {*RUN_ASSETS, "dataset_snapshot", "sweep"}


class TeamQueuedRunCoordinator(QueuedRunCoordinator):
    """QueuedRunCoordinator that sets the queue tags of the platform's runs from their specs before queueing.

    `dequeue_interval_seconds` may be a fraction of a second here (Dagster's takes whole seconds): when a run
    ends, the next one of its team leaves the queue at the daemon's next look. A look is a query of the run
    storage, a few milliseconds; the platform's daemon (training_platform_dagster/daemon.py) looks at exactly this
    interval, where Dagster's rests in half-second steps.
    """

    def __init__(self, *args: Any, dequeue_interval_seconds: float | None = None, **kwargs: Any):
        whole = None if dequeue_interval_seconds is None else max(1, math.ceil(dequeue_interval_seconds))
        super().__init__(*args, dequeue_interval_seconds=whole, **kwargs)
        self._dequeue_interval = super().dequeue_interval_seconds if whole is None else dequeue_interval_seconds

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        fields = dict(super().config_type())
        fields["dequeue_interval_seconds"] = Field(
            float, is_required=False, description="seconds between the daemon's looks at the queue (fractions too)"
        )
        return fields

    @property
    def dequeue_interval_seconds(self) -> float:  # type: ignore[override]
        return self._dequeue_interval

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        tags = queue_tags_of(run, PlatformHome.from_env(), request_user())
        if tags and any(run.tags.get(key) != value for key, value in tags.items()):
            self._instance.add_run_tags(run.run_id, tags)
        return super().submit_run(context)


def queue_tags_of(run: DagsterRun, home: PlatformHome, user: str | None = None) -> dict[str, str]:
    """The tags that queue a run of the platform's jobs (none for other jobs: they keep their own), and who asked
    for it (USER: None when the platform starts it); a RightsError when USER may not run it."""
    asked = {USER_TAG: user} if user is not None else {}
    assets = {key.to_user_string() for key in run.asset_selection or ()}
    if run.job_name not in (TRAINING_JOB, SNAPSHOT_JOB, SWEEP_JOB) and not assets & PLATFORM_ASSETS:
        if user is None:
            return {}  # the platform's own (a schedule's lifecycle pass): its tags are its own
        check_may_run_job(user, run.job_name, home.root)
        # An admin's run of another job is the platform's work: it takes no team's slots, whatever the client tagged.
        return queue_tags(UNATTRIBUTED_TEAM, "normal", **asked)
    sweep = run.job_name == SWEEP_JOB or "sweep" in assets
    spec, requested = spec_of(run, home, trains=run.job_name == TRAINING_JOB or "training_run" in assets, sweep=sweep)
    if spec is None:
        if user is not None:
            check_may_run_job(user, f"a {run.job_name} run that names no team's spec", home.root)
        return {"team": UNATTRIBUTED_TEAM, **asked}
    tags = spec_tags(spec)
    if user is not None:
        # A spec that did not come with the request is the registry's: the run continues a registered one (a resume,
        # a reproduction) and keeps its owner.
        tags["owner"] = check_may_run(user, spec, home.root, continues=not requested)
    return tags | asked


def spec_of(run: DagsterRun, home: PlatformHome, trains: bool, sweep: bool = False) -> tuple[TrainSpec | None, bool]:
    """The spec a run trains: from its config (a new run, a snapshot that starts one, a sweep's base), else the
    spec its run was registered with (for a snapshot, the run it starts; for a sweep released from the queue,
    its base); None when it has none, or one that does not parse (the run fails on it, with the full message).
    With it, whether it came in the run's config (the request) rather than from the registry or the sweep queue."""
    ops: dict[str, Any] = (run.run_config or {}).get("ops", {})
    try:
        for op in ("training_run", "dataset_snapshot"):
            raw = (ops.get(op) or {}).get("config", {}).get("spec")
            if raw:
                return spec_from_json(raw, source=f"run config of {op}"), True
        raw_sweep = (ops.get("sweep") or {}).get("config", {}).get("sweep_spec")
        if raw_sweep:
            return parse_sweep(json.loads(raw_sweep), source="run config of sweep").base_spec, True
        if sweep and (name := run.tags.get(PARTITION_TAG)):
            queued = SweepQueue(home.root).get(name)
            return (queued.sweep.base_spec if queued is not None else None), False
        registered = run.tags.get(PARTITION_TAG) if trains else run.tags.get(THEN_TRAIN_TAG)
        return (load_run_spec(home, registered) if registered else None), False
    except (PlatformError, json.JSONDecodeError):
        return None, True
