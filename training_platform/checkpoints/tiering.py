"""Tiering: keep the newest checkpoints on the fast tier, move older ones to a cold tier.

The cold tier is another storage (a cheaper bucket, or the same bucket with a colder
``storage_class``, e.g. ``s3://bucket/cold?storage_class=STANDARD_IA``). Moving copies the
chunks first (skipping those the cold tier has), then the manifest, and only then deletes
the hot manifest, so at every moment the checkpoint is complete on at least one tier. The
hot chunks it leaves behind go with the next GC. Restore reads from wherever it lives.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.reader import ChunkReader
from training_platform.checkpoints.store import CheckpointStore
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TieringPolicy:
    """Which checkpoints stay hot."""

    keep_hot_last: int = 2
    """the newest N checkpoints of a run stay on the fast tier"""
    keep_pinned_hot: bool = True
    """pinned checkpoints (a serving model, a running job) stay on the fast tier"""


@dataclass
class TieringReport:
    moved_steps: list[int]
    bytes_copied: int
    bytes_already_cold: int


def apply_tiering(store: CheckpointStore, run_id: str, policy: TieringPolicy) -> TieringReport:
    """Move the run's older hot checkpoints to the store's cold tier."""
    if store.cold is None:
        raise CheckpointError(f"store {store.uri} has no cold tier; open it with open_store(uri, cold_uri=...)")
    manifests = store.list(run_id)
    hot = [m for m in manifests if m.tier == "hot"]
    keep = {m.step for m in hot[-policy.keep_hot_last :]} if policy.keep_hot_last else set()
    if policy.keep_pinned_hot:
        keep |= {pin.step for pin in store.pins(run_id)}
    report = TieringReport([], 0, 0)
    reader = ChunkReader([store.storage])
    for manifest in hot:
        if manifest.step in keep:
            continue
        store.check_manifest(manifest)  # chunks are verified as they are read below
        for ref in manifest.chunks:
            key = chunk_key(ref.digest)
            if store.cold.exists(key):
                report.bytes_already_cold += ref.size
                continue
            store.cold.put(key, reader.read(ref), sync_parent=False)
            report.bytes_copied += ref.size
        store.cold.sync("chunks")
        key = manifest_key(run_id, manifest.step)
        store.cold.put(key, store.storage.get(key))
        store.storage.delete(key)
        report.moved_steps.append(manifest.step)
        log.info("checkpoint step %d of run %s moved to %s", manifest.step, run_id, store.cold.uri)
    return report
