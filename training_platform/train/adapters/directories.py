"""Frameworks write their checkpoints as directories; these route such directories through the store.

The store keeps them as content-addressed chunks with a manifest written last, so a framework's
checkpoint gets the same atomicity, verification and deduplication as the SDK's own.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch.distributed as dist

from training_platform.errors import CheckpointError
from training_platform.train.session import TrainingSession


def save_directory(session: TrainingSession, directory: Path, step: int, began: float | None = None) -> None:
    """Upload a checkpoint directory the framework just wrote (called on every rank; rank 0 uploads).

    `began`: when the framework started writing it (time.monotonic()), so that the save's cost
    covers the write, not only the upload.
    """
    if dist.is_initialized():
        dist.barrier()  # every rank's files (e.g. per-rank RNG states) are on disk before the upload
    if not session.dist.is_main:
        return
    started = began if began is not None else time.monotonic()
    files = {str(p.relative_to(directory)): p for p in sorted(Path(directory).rglob("*")) if p.is_file()}
    hooks = session.hooks
    manifest, _ = hooks.store.save_files(hooks.checkpoint_key, step, files, attributes={"format": "directory"})
    hooks.checkpoint_saved(manifest, time.monotonic() - started)


def restore_directory(session: TrainingSession, parent: Path, name: str = "checkpoint-{step}") -> Path | None:
    """Write the newest verified directory checkpoint under `parent` on every node; returns its path, or None.

    Rank 0 picks the checkpoint (skipping any that does not verify) and tells the others; one process
    per node writes it, into a temporary name renamed into place, so no rank reads a half-written file.
    """
    chosen = _newest_verified(session, Path(parent), name) if session.dist.is_main else None
    if dist.is_initialized():
        box = [chosen]
        dist.broadcast_object_list(box, src=0)
        chosen = box[0]
    if chosen is None:
        return None
    manifest = next(m for m in session.hooks.store.list(session.hooks.checkpoint_key) if m.step == chosen)
    target = Path(parent) / name.format(step=chosen)
    if session.dist.local_rank == 0 and not target.is_dir():
        _restore_into(session, manifest, target)
    if dist.is_initialized():
        dist.barrier()
    session.hooks.checkpoint_restored(manifest, chosen)
    return target


def _newest_verified(session: TrainingSession, parent: Path, name: str) -> int | None:
    for manifest in session.hooks.restore_candidates():
        if manifest.kind != "files":
            continue
        try:
            _restore_into(session, manifest, parent / name.format(step=manifest.step))
        except CheckpointError as exc:
            session.hooks.reporter.info(f"skipped checkpoint step {manifest.step}: {exc}")
            continue
        return manifest.step
    return None


def _restore_into(session: TrainingSession, manifest, target: Path) -> None:
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        session.hooks.store.restore_files(manifest, staging)
    except CheckpointError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
