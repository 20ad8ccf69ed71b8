"""Checks a spec against the environment before anything launches: refuse early, lose nothing."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

from training_platform.datasets import load_manifest
from training_platform.errors import SnapshotError, SpecError
from training_platform.paths import PlatformHome
from training_platform.spec import TrainSpec


def check_snapshot(spec: TrainSpec, home: PlatformHome) -> None:
    if spec.dataset.snapshot_id is None:
        return
    try:
        load_manifest(home.snapshots, spec.dataset.snapshot_id)
    except SnapshotError as exc:
        raise SpecError(f"dataset.snapshot_id: {exc}") from None


def check_store_writable(store_uri: str) -> None:
    """A local checkpoint directory must be creatable and writable (S3 is checked by its tier)."""
    if store_uri.startswith("s3://"):
        return
    path = Path(store_uri.removeprefix("file://")).expanduser()
    probe = path / f".tp-write-probe-{uuid.uuid4().hex}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpecError(
            f"checkpoint.store_uri: cannot write to {path} ({exc.strerror}); "
            "point it at a writable directory or fix its permissions"
        ) from None


def check_entrypoint(spec: TrainSpec) -> None:
    """The user's script must exist (and its module be importable) before anything launches."""
    entrypoint = spec.entrypoint
    if entrypoint is None:
        return
    if entrypoint.script and not Path(entrypoint.script).is_file():
        raise SpecError(
            f"entrypoint.script: {entrypoint.script} does not exist; give a path relative to the spec file"
        )
    if entrypoint.module and importlib.util.find_spec(entrypoint.module.split(".")[0]) is None:
        raise SpecError(
            f"entrypoint.module: cannot import {entrypoint.module!r}; install its package in the environment "
            "(pip install -e .) or use entrypoint.script"
        )


def preflight(spec: TrainSpec, home: PlatformHome, store_uri: str) -> None:
    check_snapshot(spec, home)
    check_store_writable(store_uri)
    check_entrypoint(spec)
