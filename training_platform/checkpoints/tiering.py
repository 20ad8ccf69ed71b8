"""Tiering: keep recent checkpoints on the fast tier, move older ones to a cold tier.

The cold tier is another storage (a cheaper bucket, the same bucket with a colder
``storage_class``, e.g. ``s3://bucket/cold?storage_class=STANDARD_IA``, or a cold local
directory). Moving copies the chunks first (skipping those the cold tier has), then the manifest,
and only then deletes the hot manifest, so at every moment the checkpoint is complete on at least
one tier. The hot chunks it leaves behind go with the next GC. Restore reads from wherever it lives.

A GC of the cold tier may run meanwhile: the chunks being moved are listed in a lease on the cold
tier first, and only after the lease settled does the move look at what the cold tier already has
(the writer's protocol, see retention.py), so a chunk found there is not deleted before the cold
manifest names it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from training_platform.checkpoints.layout import chunk_key, lease_key, manifest_key
from training_platform.checkpoints.manifest import CheckpointManifest
from training_platform.checkpoints.reader import ChunkReader
from training_platform.checkpoints.removed import record_removal
from training_platform.checkpoints.store import CheckpointStore
from training_platform.checkpoints.writer import settle_seconds
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TieringPolicy:
    """Which checkpoints stay hot: a checkpoint kept by any rule stays."""

    keep_hot_last: int = 2
    """the newest N checkpoints of a run stay on the fast tier"""
    keep_pinned_hot: bool = True
    """pinned checkpoints (a registered model, a running job) stay on the fast tier"""
    older_than_days: float | None = None
    """move only checkpoints saved more than this many days ago (None: any age)"""


@dataclass
class TieringReport:
    moved_steps: list[int] = field(default_factory=list)
    bytes_copied: int = 0
    bytes_already_cold: int = 0


def to_move(store: CheckpointStore, run_id: str, policy: TieringPolicy, now: datetime) -> list[CheckpointManifest]:
    """The run's hot checkpoints the policy sends to the cold tier, oldest first."""
    hot = [m for m in store.list(run_id) if m.tier == "hot"]
    keep = {m.step for m in hot[-policy.keep_hot_last :]} if policy.keep_hot_last else set()
    if policy.keep_pinned_hot:
        keep |= {pin.step for pin in store.pins(run_id)}
    if policy.older_than_days is not None:
        cutoff = now - timedelta(days=policy.older_than_days)
        keep |= {m.step for m in hot if _saved_at(m) > cutoff}
    return [m for m in hot if m.step not in keep]


def apply_tiering(
    store: CheckpointStore, run_id: str, policy: TieringPolicy, *, now: datetime | None = None
) -> TieringReport:
    """Move the run's hot checkpoints the policy does not keep to the store's cold tier."""
    if store.cold is None:
        raise CheckpointError(f"store {store.uri} has no cold tier; open it with open_store(uri, cold_uri=...)")
    moving = to_move(store, run_id, policy, now or datetime.now(UTC))
    report = TieringReport()
    if not moving:
        return report
    for manifest in moving:
        store.check_manifest(manifest)  # chunks are verified as they are read below
    lease = lease_key(uuid.uuid4().hex)
    digests = sorted({ref.digest for m in moving for ref in m.chunks})
    store.cold.put(lease, json.dumps({"run_id": run_id, "tiering": True, "chunks": digests}).encode())
    try:
        time.sleep(settle_seconds(store.lease_settle_seconds))  # see the module docstring
        reader = ChunkReader([store.storage])
        for manifest in moving:
            _copy(store, manifest, reader, report)
    finally:
        store.cold.delete(lease)
    return report


def _copy(store: CheckpointStore, manifest: CheckpointManifest, reader: ChunkReader, report: TieringReport) -> None:
    for ref in manifest.chunks:
        key = chunk_key(ref.digest)
        stored = store.cold.stat(key)
        if stored is not None and stored.size == ref.size:
            report.bytes_already_cold += ref.size
            continue
        store.cold.put(key, reader.read(ref), sync_parent=False)
        report.bytes_copied += ref.size
    store.cold.sync("chunks")
    key = manifest_key(manifest.run_id, manifest.step)
    store.cold.put(key, store.storage.get(key))
    record_removal(store.storage, manifest, "tiered")  # the hot chunks it frees are the run's
    store.storage.delete(key)
    report.moved_steps.append(manifest.step)
    log.info("checkpoint step %d of run %s moved to %s", manifest.step, manifest.run_id, store.cold.uri)


def _saved_at(manifest: CheckpointManifest) -> datetime:
    try:
        when = datetime.fromisoformat(manifest.created_at)
    except ValueError:  # an unreadable time is not evidence of age: it stays hot
        return datetime.max.replace(tzinfo=UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)
