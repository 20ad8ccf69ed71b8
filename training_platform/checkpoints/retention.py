"""Retention (which checkpoints to keep) and garbage collection (which chunks to delete).

Retention removes manifests only; chunks go when GC finds no manifest, pin or lease that
references them. GC is safe while saves run:

- a chunk younger than the grace period (by the storage's own clock: see storage_now) is
  never deleted; a save writes its new chunks and then its lease or manifest, so the grace
  must outlast a save's chunk phase plus a second (the default is an hour). GC reads a
  candidate's age again right before it takes it: the chunk it listed as old may have been
  deleted since (by another GC) and written anew by a save. What is left open is a chunk
  deleted and written anew between that look and the move (two storage calls apart), by a
  save whose manifest is out only after GC's second read (below);
- a save that reused existing chunks lists them in a lease, waits LEASE_SETTLE_SECONDS,
  re-checks them (rewriting any that vanished), writes its manifest, then drops the lease;
- GC reads leases, then manifests, and takes chunks only within GC_DELETE_WINDOW_SECONDS of
  that read (re-reading otherwise). It moves them to trash/, reads leases and manifests again,
  and only then deletes what they do not name, putting the rest back. A move that lands after
  a save's re-check (a GC thread stalled past its window) therefore comes after that save's
  lease was out, so the second read names the chunk; a move before the re-check makes the save
  write the chunk again. The window keeps such put-backs rare: a reader in between finds the
  chunk in trash/ (reader.py).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from training_platform.checkpoints.layout import (
    TRASH,
    chunk_key,
    clock_probe_key,
    is_object_name,
    pack_index_key,
    pack_key,
    parse_trash_key,
    step_of_manifest_key,
    trash_key,
)
from training_platform.checkpoints.manifest import CheckpointManifest, parse_manifest, stored_names
from training_platform.checkpoints.packs import PACKS, pack_indexes
from training_platform.checkpoints.removed import Removals
from training_platform.checkpoints.storage import Storage
from training_platform.checkpoints.writer import MIN_SETTLE_SECONDS
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)

GC_DELETE_WINDOW_SECONDS = MIN_SETTLE_SECONDS * 0.6
STALE_LEASE_SECONDS = 24 * 3600.0
STALE_TEMPORARY_SECONDS = 3600.0
STALE_TRASH_SECONDS = 3600.0
"""a chunk set aside this long ago belongs to a GC that died before it deleted or put it back"""


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """Which checkpoints of a run to keep; a checkpoint kept by any rule (or pinned) stays."""

    keep_last: int = 3
    """the K checkpoints saved last (by save time, not by step)"""
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
    newest_saves = [m.step for m in by_save_time(manifests)[-policy.keep_last :]] if policy.keep_last else []
    keep = set(newest_saves)
    if policy.keep_every:
        keep |= {s for s in steps if s % policy.keep_every == 0}
    if policy.keep_best and policy.best_metric:
        scored = [m for m in manifests if policy.best_metric in m.metrics]
        scored.sort(key=lambda m: m.metrics[policy.best_metric], reverse=policy.best_mode == "max")
        keep |= {m.step for m in scored[: policy.keep_best]}
    return keep | (pinned & set(steps))


def by_save_time(manifests: list[CheckpointManifest]) -> list[CheckpointManifest]:
    """Oldest save first. Not by step: a run that fell back to an older checkpoint saves lower
    steps after higher, broken ones, and its newest saves are the ones to keep."""

    def saved_at(manifest: CheckpointManifest) -> tuple[datetime, int]:
        try:
            when = datetime.fromisoformat(manifest.created_at)
        except ValueError:
            when = datetime.min
        return (when if when.tzinfo else when.replace(tzinfo=UTC)), manifest.step

    return sorted(manifests, key=saved_at)


@dataclass
class Freed:
    chunks: int = 0
    bytes: int = 0

    def add(self, other: Freed) -> Freed:
        return Freed(self.chunks + other.chunks, self.bytes + other.bytes)


UNATTRIBUTED = ""
"""`by_run` key of chunks no removal record names (saves that died before their manifest, older prunes)"""


@dataclass
class GcReport:
    deleted_chunks: int = 0
    deleted_bytes: int = 0
    kept_chunks: int = 0
    young_chunks: int = 0
    deleted: list[str] = field(default_factory=list)
    postponed_chunks: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    """unreadable manifests and leases (uri -> why): every chunk their text names was kept"""
    dry_run: bool = False
    """nothing was deleted: `deleted_*` and `by_run` say what would have been"""
    stored_bytes: int = 0
    """bytes of every chunk on the tier before this collection"""
    by_run: dict[str, Freed] = field(default_factory=dict)
    """what was freed per run whose removed checkpoints named the chunks (removed.py)"""
    put_back_chunks: int = 0
    """chunks set aside and then put back: a save named them meanwhile, or a dead GC had left them"""

    def merged(self, other: GcReport) -> GcReport:
        runs = {
            run: self.by_run.get(run, Freed()).add(other.by_run.get(run, Freed())) for run in self.by_run | other.by_run
        }
        return GcReport(
            deleted_chunks=self.deleted_chunks + other.deleted_chunks,
            deleted_bytes=self.deleted_bytes + other.deleted_bytes,
            kept_chunks=self.kept_chunks + other.kept_chunks,
            young_chunks=self.young_chunks + other.young_chunks,
            deleted=self.deleted + other.deleted,
            postponed_chunks=self.postponed_chunks + other.postponed_chunks,
            skipped=self.skipped | other.skipped,
            dry_run=self.dry_run or other.dry_run,
            stored_bytes=self.stored_bytes + other.stored_bytes,
            by_run=runs,
            put_back_chunks=self.put_back_chunks + other.put_back_chunks,
        )

    def freed(self, digest: str, size: int, run_id: str) -> None:
        self.deleted_chunks += 1
        self.deleted_bytes += size
        self.deleted.append(digest)
        self.by_run[run_id] = self.by_run.get(run_id, Freed()).add(Freed(1, size))


_CHUNK_NAME = re.compile(rb"[0-9a-f]{64}")


def named_chunks(raw: bytes) -> set[str]:
    """Every chunk name in the text of an object that does not parse (torn, edited, of a newer
    format): the chunks it may reference, as far as can be told without reading it."""
    return {match.decode() for match in _CHUNK_NAME.findall(raw)}


class _References:
    """Chunks referenced by manifests; a manifest is immutable, so each is read once.

    A manifest that does not parse keeps every chunk its text names, and only those: the rest of
    the store is collected as usual (its run's checkpoint cannot be restored anyway).
    """

    def __init__(self, storage: Storage, report: GcReport):
        self.storage = storage
        self.report = report
        self._by_key: dict[str, set[str]] = {}

    def refresh(self) -> set[str]:
        keys = {k for k in self.storage.list("runs") if step_of_manifest_key(k) is not None}
        for key in keys - set(self._by_key):
            try:
                raw = self.storage.get(key)
            except FileNotFoundError:
                continue
            try:
                self._by_key[key] = stored_names(parse_manifest(raw).chunks)
            except (CheckpointError, ValueError) as exc:
                self._by_key[key] = named_chunks(raw)
                _skip(self.report, f"{self.storage.uri}/{key}", f"manifest is unreadable ({exc})")
        for key in set(self._by_key) - keys:
            del self._by_key[key]
        return set().union(*self._by_key.values()) if self._by_key else set()


def _skip(report: GcReport, uri: str, reason: str) -> None:
    if uri not in report.skipped:
        log.warning("GC keeps every chunk %s names: its %s", uri, reason)
    report.skipped[uri] = reason


def _leased(storage: Storage, now: float, report: GcReport) -> set[str]:
    chunks: set[str] = set()
    for info in storage.list_info("leases"):
        if now - info.modified > STALE_LEASE_SECONDS:
            if not report.dry_run:
                storage.delete(info.key)  # left by a killed save long ago
            continue
        try:
            raw = storage.get(info.key)
        except FileNotFoundError:
            continue
        try:
            chunks.update(json.loads(raw)["chunks"])
        except (ValueError, KeyError, TypeError) as exc:
            chunks.update(named_chunks(raw))
            _skip(report, f"{storage.uri}/{info.key}", f"lease is unreadable ({exc})")
    return chunks


def storage_now(storage: Storage) -> float:
    """The storage's own clock: the modification time it gives a probe object written now.

    Ages compare it with the storage's modification times, so a fast or slow local clock does not
    make a save in flight look old (nor an old chunk look young).
    """
    key = clock_probe_key()
    storage.put(key, b"", sync_parent=False)
    try:
        info = storage.stat(key)
    finally:
        storage.delete(key)
    if info is None:
        raise CheckpointError(f"GC stopped: {storage.uri}/{key} vanished right after it was written")
    return info.modified


@dataclass(frozen=True)
class _Stored:
    """What GC keeps or takes whole: a chunk on its own, or a pack. A chunk is kept while a manifest or lease
    names its digest, a pack while one names the pack (a reference that locates a chunk there: another copy
    of the same bytes, in another pack or on its own, does not keep it)."""

    key: str
    name: str
    """its digest or the pack's id: what names it, and its name in trash/"""
    size: int
    chunks: frozenset[str]
    """the digests of the chunks it holds: which runs' removals it settles"""


def _listed(storage: Storage) -> list[tuple[_Stored, float]]:
    """Every chunk and pack on the tier, with its modification time."""
    listed = []
    for info in storage.list_info("chunks"):
        digest = info.key.rsplit("/", 1)[-1]
        listed.append((_Stored(info.key, digest, info.size, frozenset([digest])), info.modified))
    indexes = pack_indexes(storage)  # none for a save that died before its index, or a damaged one
    for info in storage.list_info(PACKS):
        pack_id = info.key.rsplit("/", 1)[-1]
        if is_object_name(pack_id):  # not an index: that goes with its pack
            chunks = frozenset(ref.digest for ref in indexes.get(pack_id, []))
            listed.append((_Stored(info.key, pack_id, info.size, chunks), info.modified))
    return listed


def _set_aside(storage: Storage, stored: _Stored, target: str, old_before: float) -> Literal["aside", "gone", "young"]:
    """Move a candidate to trash/ unless it is gone or was written since it was listed."""
    info = storage.stat(stored.key)
    if info is None:
        return "gone"
    if info.modified > old_before:  # as the listing judges age: a chunk written at the cutoff is old
        return "young"
    try:
        storage.move(stored.key, target)
    except FileNotFoundError:
        return "gone"
    return "aside"


def _put_back(storage: Storage, key: str, original: str, report: GcReport) -> None:
    # A save may have written the chunk anew meanwhile: the same bytes, so overwriting is harmless.
    storage.move(key, original)
    report.put_back_chunks += 1
    report.kept_chunks += 1
    log.info("GC of %s put %s back: a lease or manifest names it", storage.uri, original)


def _delete_aside(storage: Storage, key: str, original: str) -> None:
    """Delete what was set aside from ORIGINAL. A pack's index goes first, unless the pack is back in its place
    (put back by another GC): a GC that dies between the two deletes leaves a pack in trash/ with no index,
    which the next one settles as named by nothing, never an index without its pack. (Sweeping such indexes
    instead took kept ones: a pack that other GCs set aside and put back while one listed packs/ and trash/
    is in neither listing.)"""
    if original.startswith(f"{PACKS}/") and not storage.exists(original):
        storage.delete(pack_index_key(original.rsplit("/", 1)[-1]))
    storage.delete(key)


def _settle_left_aside(storage: Storage, now: float, referenced: set[str], report: GcReport) -> None:
    """Finish what a GC that died between setting chunks aside and deleting them left in trash/."""
    for key in storage.list(TRASH):
        name, when = parse_trash_key(key)
        if not is_object_name(name):
            continue  # not put there by a GC
        if when is not None and now - when < STALE_TRASH_SECONDS:
            continue  # a GC at work may still put it back
        original = pack_key(name) if storage.exists(pack_index_key(name)) else chunk_key(name)
        if name in referenced and not storage.exists(original):
            _put_back(storage, key, original, report)
        else:
            _delete_aside(storage, key, original)


def collect_garbage(storage: Storage, grace_seconds: float = 3600.0, *, dry_run: bool = False) -> GcReport:
    """Delete unreferenced chunks and packs older than `grace_seconds` from one storage tier.

    `dry_run`: delete nothing; the report says what would have been freed.
    """
    report = GcReport(dry_run=dry_run)
    references = _References(storage, report)
    removals = Removals(storage)
    now = storage_now(storage)

    def named() -> set[str]:
        """Every chunk a lease or manifest names now (leases first: see the module docstring)."""
        return _leased(storage, now, report) | references.refresh()

    def run_of(stored: _Stored) -> str:
        return next((removals.run_of[d] for d in sorted(stored.chunks) if d in removals.run_of), UNATTRIBUTED)

    referenced = named()
    candidates: list[_Stored] = []
    young: set[str] = set()
    for stored, modified in _listed(storage):
        report.stored_bytes += stored.size
        if stored.name in referenced:
            report.kept_chunks += 1
        elif now - modified < grace_seconds:
            report.young_chunks += 1
            young |= stored.chunks
        else:
            candidates.append(stored)
    if dry_run:
        for stored in candidates:
            report.freed(stored.name, stored.size, run_of(stored))
        return report
    _settle_left_aside(storage, now, referenced, report)
    gc_id, started = uuid.uuid4().hex[:12], time.monotonic()
    idle_rounds = 0
    while candidates and idle_rounds < 3:
        leases_read_at = time.monotonic()
        protected = named()
        # Re-reading took longer than the window (a slow store): nothing may be taken this round.
        idle_rounds = idle_rounds + 1 if time.monotonic() - leases_read_at >= GC_DELETE_WINDOW_SECONDS else 0
        aside: list[tuple[_Stored, str]] = []
        while candidates and time.monotonic() - leases_read_at < GC_DELETE_WINDOW_SECONDS:
            stored = candidates.pop()
            if stored.name in protected:
                report.kept_chunks += 1
                continue
            target = trash_key(stored.name, now + time.monotonic() - started, gc_id)
            taken = _set_aside(storage, stored, target, now - grace_seconds)
            if taken == "aside":
                aside.append((stored, target))
            elif taken == "young":
                report.young_chunks += 1
                young |= stored.chunks
        if aside:
            named_now = named()
            for stored, target in aside:
                if stored.name in named_now:
                    _put_back(storage, target, stored.key, report)
                else:
                    _delete_aside(storage, target, stored.key)
                    report.freed(stored.name, stored.size, run_of(stored))
    if candidates:
        report.postponed_chunks = len(candidates)
        log.warning(
            "GC of %s postponed %d chunks: listing leases and manifests is slower than %.2f s",
            storage.uri,
            len(candidates),
            GC_DELETE_WINDOW_SECONDS,
        )
    removals.drop_settled(young | {digest for stored in candidates for digest in stored.chunks})
    if hasattr(storage, "remove_stale_temporaries"):
        # Not the chunk grace: a temporary may belong to a put in progress right now.
        storage.remove_stale_temporaries(STALE_TEMPORARY_SECONDS, now=now)
    log.info("GC of %s: deleted %d chunks (%d bytes)", storage.uri, report.deleted_chunks, report.deleted_bytes)
    return report
