"""The run registry: the spec each run (Dagster partition) was created with, kept on disk.

A partition key alone is enough to re-run or reproduce a run: its spec is here.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

from training_platform.errors import SpecError
from training_platform.launch.base import RESULT_FILE
from training_platform.paths import PlatformHome
from training_platform.spec import TrainSpec, parse_spec

SUBMITTED_SPEC = "submitted_spec.json"


def new_run_id(spec: TrainSpec) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{spec.name}-{stamp}-{secrets.token_hex(2)}"


def register_run(home: PlatformHome, spec: TrainSpec, run_id: str | None = None) -> str:
    run_id = run_id or new_run_id(spec)
    run_dir = home.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SUBMITTED_SPEC).write_text(spec.model_dump_json(indent=2))
    return run_id


def load_run_spec(home: PlatformHome, run_id: str) -> TrainSpec:
    path = home.run_dir(run_id) / SUBMITTED_SPEC
    if not path.is_file():
        raise SpecError(
            f"run {run_id!r} has no recorded spec at {path}; create runs with `tp train SPEC` "
            "(or register the partition's spec before materializing it)"
        )
    return parse_spec(json.loads(path.read_text()), source=str(path))


def read_result(home: PlatformHome, run_id: str) -> dict | None:
    path: Path = home.run_dir(run_id) / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None
