"""The run registry: the spec each run (Dagster partition) was created with.

A partition key alone is enough to re-run or reproduce a run: its spec is here (runs/registry.py says where).
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

from training_platform.errors import SpecError
from training_platform.identifiers import check_run_id
from training_platform.paths import PlatformHome
from training_platform.runs.backends import open_run_registry
from training_platform.runs.layout import RESULT_FILE
from training_platform.spec import TrainSpec, parse_spec
from training_platform.spec.submission import OWN_CODE_ASSETS, OWN_CODE_TAG, assets_for

# Dagster's queued run coordinator runs higher `dagster/priority` first (see deploy/dagster/dagster.yaml).
PRIORITY_TAGS = {"low": "-10", "normal": "0", "high": "10"}


def queue_tags(team: str, priority: str, **extra: str) -> dict[str, str]:
    """Tags that place a run in the Dagster queue: per-team concurrency (`team`) and priority."""
    return {"team": team, "dagster/priority": PRIORITY_TAGS[priority], **extra}


def spec_tags(spec: TrainSpec, **extra: str) -> dict[str, str]:
    """The queue tags of a run of `spec`, with its owner (and the mark of a user's own script)."""
    own_code = {OWN_CODE_TAG: "1"} if assets_for(spec) == OWN_CODE_ASSETS else {}
    return queue_tags(spec.team, spec.resources.priority, owner=spec.owner, **own_code, **extra)


def new_run_id(spec: TrainSpec) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{spec.name}-{stamp}-{secrets.token_hex(2)}"


def register_run(home: PlatformHome, spec: TrainSpec, run_id: str | None = None, trial: dict | None = None) -> str:
    """Record `spec` as the run's spec (a new run id when none is given), with the context of the sweep trial the
    run is (sweeps/trial.py); a registered run keeps its own."""
    run_id = new_run_id(spec) if run_id is None else run_id
    _registered(home, run_id, spec, trial)
    return run_id


def register_submitted(home: PlatformHome, run_id: str, spec_json: str) -> TrainSpec:
    """Register a run submitted with its spec (a server-side `register_run`); a registered run keeps its own."""
    return _registered(home, run_id, spec_from_json(spec_json, source=f"run {run_id}'s submitted spec"))


def _registered(home: PlatformHome, run_id: str, spec: TrainSpec, trial: dict | None = None) -> TrainSpec:
    registry = open_run_registry(home)
    trial_json = json.dumps(trial, indent=2) if trial is not None else None
    recorded = registry.add(check_run_id(run_id), spec.team, spec.model_dump_json(indent=2), trial_json)
    registered = spec_from_json(recorded, source=f"run {run_id}'s spec in {registry.where}")
    if registered != spec:
        raise SpecError(
            f"run {run_id!r} was registered with another spec; submit the new spec as a new run "
            f"(`tp train SPEC` picks a new run id), or `tp resume {run_id}` to continue the registered one"
        )
    return registered


def is_registered(home: PlatformHome, run_id: str) -> bool:
    return open_run_registry(home).get(run_id) is not None


def spec_from_json(raw: str, source: str) -> TrainSpec:
    """A spec sent as JSON (run config, a sensor's request), validated like a YAML file."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{source}: not JSON ({exc}); submit runs with `tp train SPEC`") from None
    return parse_spec(data, source=source)


def load_run_spec(home: PlatformHome, run_id: str) -> TrainSpec:
    registry = open_run_registry(home)
    recorded = registry.get(run_id)
    if recorded is None:
        raise SpecError(
            f"run {run_id!r} has no recorded spec in {registry.where}; create runs with `tp train SPEC` "
            "(or register the partition's spec before materializing it)"
        )
    return spec_from_json(recorded, source=f"run {run_id}'s spec in {registry.where}")


def read_result(home: PlatformHome, run_id: str) -> dict | None:
    path: Path = home.run_dir(run_id) / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None
