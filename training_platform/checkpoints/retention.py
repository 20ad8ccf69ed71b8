"""Retention (which checkpoints to keep) and garbage collection (which chunks to delete).

Retention removes manifests only; chunks go when GC finds no manifest, pin or lease that
references them. GC is safe while saves run:

- a chunk younger than the grace period is never deleted; a save writes its new chunks and
  then its lease or manifest, so the grace must outlast a save's chunk phase plus a second
  (the default is an hour);
- a save that reused existing chunks lists them in a lease, waits LEASE_SETTLE_SECONDS,
  re-checks them (rewriting any that vanished), writes its manifest, then drops the lease;
- GC reads leases, then manifests, and deletes only within GC_DELETE_WINDOW_SECONDS of that
  lease read (re-reading otherwise). A delete that lands after a save's re-check therefore
  happened less than the window after the lease read, so that read saw the lease, or saw
  the manifest that replaced it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from training_platform.checkpoints.layout import chunk_key, step_of_manifest_key
from training_platform.checkpoints.manifest import CheckpointManifest, parse_manifest
from training_platform.checkpoints.storage import Storage
from training_platform.checkpoints.writer import MIN_SETTLE_SECONDS
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)

GC_DELETE_WINDOW_SECONDS = MIN_SETTLE_SECONDS * 0.6
STALE_LEASE_SECONDS = 24 * 3600.0
STALE_TEMPORARY_SECONDS = 3600.0


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """Which checkpoints of a run to keep; a checkpoint kept by any rule (or pinned) stays."""

    keep_last: int = 3
    """the newest K checkpoints"""
    keep_best: int = 0
    """the best N by `best_metric`"""
    best_metric: str | None = None
    """metric name in the manifest's metrics, e.g. 'val_loss'"""
    best_mode: str = "min"
    """'min' when lower is better, 'max' when higher is better"""
    keep_every: int = 0
    """every checkpoint whose step is a multiple of M (0: none)"""

    def __post_init__(self) -> None:
        if self.keep_last < 0 or self.keep_best < 0 or self.keep_every < 0:
            raise ValueError("retention counts must be >= 0")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        if self.keep_best and not self.best_metric:
            raise ValueError("keep_best needs best_metric (the metric name to rank checkpoints by)")


def steps_to_keep(manifests: list[CheckpointManifest], policy: RetentionPolicy, pinned: set[int]) -> set[int]:
    steps = sorted(m.step for m in manifests)
    keep = set(steps[-policy.keep_last :]) if policy.keep_last else set()
    if policy.keep_every:
        keep |= {s for s in steps if s % policy.keep_every == 0}
    if policy.keep_best and policy.best_metric:
        scored = [m for m in manifests if policy.best_metric in m.metrics]
        scored.sort(key=lambda m: m.metrics[policy.best_metric], reverse=policy.best_mode == "max")
        keep |= {m.step for m in scored[: policy.keep_best]}
    return keep | (pinned & set(steps))


@dataclass
class GcReport:
    deleted_chunks: int = 0
    deleted_bytes: int = 0
    kept_chunks: int = 0
    young_chunks: int = 0
    deleted: list[str] = field(default_factory=list)
    postponed_chunks: int = 0

    def merged(self, other: GcReport) -> GcReport:
        return GcReport(
            self.deleted_chunks + other.deleted_chunks,
            self.deleted_bytes + other.deleted_bytes,
            self.kept_chunks + other.kept_chunks,
            self.young_chunks + other.young_chunks,
            self.deleted + other.deleted,
            self.postponed_chunks + other.postponed_chunks,
        )


class _References:
    """Chunks referenced by manifests; a manifest is immutable, so each is read once."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._by_key: dict[str, set[str]] = {}

    def refresh(self) -> set[str]:
        keys = {k for k in self.storage.list("runs") if step_of_manifest_key(k) is not None}
        for key in keys - set(self._by_key):
            try:
                manifest = parse_manifest(self.storage.get(key))
                self._by_key[key] = {ref.digest for ref in manifest.chunks}
            except FileNotFoundError:
                continue
            except (CheckpointError, ValueError) as exc:
                # An unreadable manifest cannot tell us its chunks: keep everything this pass.
                raise RuntimeError(f"GC stopped: manifest {self.storage.uri}/{key} is unreadable ({exc})") from exc
        for key in set(self._by_key) - keys:
            del self._by_key[key]
        return set().union(*self._by_key.values()) if self._by_key else set()


def _leased(storage: Storage) -> set[str]:
    chunks: set[str] = set()
    now = time.time()
    for info in storage.list_info("leases"):
        if now - info.modified > STALE_LEASE_SECONDS:
            storage.delete(info.key)  # left by a killed save long ago
            continue
        try:
            chunks.update(json.loads(storage.get(info.key))["chunks"])
        except FileNotFoundError:
            continue
        except (ValueError, KeyError) as exc:
            raise RuntimeError(f"GC stopped: lease {storage.uri}/{info.key} is unreadable ({exc})") from exc
    return chunks


def collect_garbage(storage: Storage, grace_seconds: float = 3600.0) -> GcReport:
    """Delete unreferenced chunks older than `grace_seconds` from one storage tier."""
    report = GcReport()
    references = _References(storage)
    referenced = _leased(storage) | references.refresh()
    now = time.time()
    candidates = []
    for info in storage.list_info("chunks"):
        digest = info.key.rsplit("/", 1)[-1]
        if digest in referenced:
            report.kept_chunks += 1
        elif now - info.modified < grace_seconds:
            report.young_chunks += 1
        else:
            candidates.append((digest, info.size))
    idle_rounds = 0
    while candidates and idle_rounds < 3:
        leases_read_at = time.monotonic()
        protected = _leased(storage) | references.refresh()
        # Re-reading took longer than the window (a slow store): nothing may be deleted this round.
        idle_rounds = idle_rounds + 1 if time.monotonic() - leases_read_at >= GC_DELETE_WINDOW_SECONDS else 0
        while candidates and time.monotonic() - leases_read_at < GC_DELETE_WINDOW_SECONDS:
            digest, size = candidates.pop()
            if digest in protected:
                report.kept_chunks += 1
                continue
            storage.delete(chunk_key(digest))
            report.deleted_chunks += 1
            report.deleted_bytes += size
            report.deleted.append(digest)
    if candidates:
        report.postponed_chunks = len(candidates)
        log.warning(
            "GC of %s postponed %d chunks: listing leases and manifests is slower than %.2f s",
            storage.uri,
            len(candidates),
            GC_DELETE_WINDOW_SECONDS,
        )
    if hasattr(storage, "remove_stale_temporaries"):
        # Not the chunk grace: a temporary may belong to a put in progress right now.
        storage.remove_stale_temporaries(STALE_TEMPORARY_SECONDS)
    log.info("GC of %s: deleted %d chunks (%d bytes)", storage.uri, report.deleted_chunks, report.deleted_bytes)
    return report
