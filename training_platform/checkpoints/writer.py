"""Write one checkpoint: chunks in parallel (hash, dedup, write, fsync), then the manifest last.

Torch-free on purpose: the background writer process imports only this, the storage and
the manifest, so it starts in a fraction of a second and holds no training memory.

Large tensors are cut into CHUNK_BYTES pieces; small tensors share a chunk so a model of a thousand
small tensors is not a thousand chunks (and S3 requests). Chunks follow tensors: every tensor from
PACK_BELOW_BYTES up starts a chunk of its own, and a shared chunk holds at most PACK_BYTES, so a
tensor that did not change is not written again because a neighbour did (a frozen backbone costs
nothing after its first save, whatever the model's size). On a filesystem, new chunks are appended
to pack files (packs.py), where they keep their names. Hashing and writing release the GIL, so a
small thread pool keeps both the CPU and the disk busy.

GC safety (see retention.gc): chunks this save found already present are listed in a lease
object before they are re-checked, and the re-check happens at least LEASE_SETTLE_SECONDS
after the lease became visible, longer than GC's lease-to-delete window. A save is therefore
staged (chunks written, lease put: `stage_checkpoint`) and then finished (settle, re-check,
manifest: `StagedCheckpoint.finish`); the background writer lets the trainer reuse its snapshot
buffer in between, so a save that settles does not hold up the next one.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_platform.checkpoints.layout import chunk_key, lease_key, manifest_key, pack_key
from training_platform.checkpoints.manifest import (
    MAX_CHUNK_BYTES,
    CheckpointManifest,
    ChunkRef,
    FileRef,
    SaveRecord,
    TensorRef,
    chunk_digest,
    stored_names,
)
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.packs import PACKS, PackWriter, packed_chunks, packs_supported
from training_platform.checkpoints.signing import ManifestSigner
from training_platform.checkpoints.storage import NotWanted, Storage
from training_platform.errors import CheckpointError

CHUNK_BYTES = 64 << 20
# Below this a tensor shares a pack: biases and norms, whose own files would cost more than rewriting them.
PACK_BELOW_BYTES = 256 << 10
# A pack's most bytes: what one changed small tensor can make a save rewrite beside itself.
PACK_BYTES = 4 << 20
LEASE_SETTLE_SECONDS = 1.0
# GC deletes within GC_DELETE_WINDOW_SECONDS of reading the leases (retention.py); settling must be longer.
MIN_SETTLE_SECONDS = 0.5
# Hashing and writing release the GIL: a few more threads than cores keeps both CPU and disk busy.
WRITE_WORKERS = max(4, min(16, os.cpu_count() or 4))


@dataclass
class Blob:
    """One tensor's raw bytes (a view, not a copy) with its dtype name and shape."""

    data: memoryview
    dtype: str
    shape: list[int]


@dataclass
class SaveStats:
    bytes_written: int = 0
    bytes_deduplicated: int = 0
    stall_seconds: float = 0.0
    background_seconds: float = 0.0
    paced_idle_seconds: float = 0.0
    """wall time the chunks' writing spent only waiting for its pace (not work: see pacing.py)"""
    _reused: dict[str, memoryview | None] = field(default_factory=dict, repr=False)
    """chunks this save found already stored: digest -> its bytes (None once the snapshot is released)"""
    _reused_packs: dict[str, str] = field(default_factory=dict, repr=False)
    """of those, the ones found in a pack: digest -> the pack"""


class ChunkSink:
    """Hashes a piece, skips it when the store already has it, else writes it durably (at the pacer's pace).

    New chunks go to packs where the storage has them (packs.py): `close` seals those, and must come
    before a manifest names them.
    """

    def __init__(self, storage: Storage, stats: SaveStats, pacer: Pacer):
        self.storage = storage
        self.stats = stats
        self.pacer = pacer
        self._lock = threading.Lock()
        self._claimed: dict[str, ChunkRef | None] = {}
        """digests this save has met: where it stored or found each (None while that is under way)"""
        self._packs = PackWriter(storage) if packs_supported(storage) else None
        self._packed: dict[str, ChunkRef] | None = None
        self._pack_sizes: dict[str, int] = {}

    def put(self, piece: memoryview) -> ChunkRef:
        with self.pacer.turn(len(piece)):
            return self._put(piece)

    def _put(self, piece: memoryview) -> ChunkRef:
        ref = ChunkRef(digest=chunk_digest(piece), size=len(piece))
        with self._lock:
            first = ref.digest not in self._claimed
            if first:
                self._claimed[ref.digest] = None
            earlier = self._claimed[ref.digest]
        # A piece this save met before: its location when known (else, packed, written once more: rare).
        if not first and (earlier is not None or self._packs is None):
            with self._lock:
                self.stats.bytes_deduplicated += len(piece)
            return earlier or ref
        if first and (stored := self._stored(ref)) is not None:
            with self._lock:
                self.stats.bytes_deduplicated += len(piece)
                self.stats._reused[ref.digest] = piece
                if stored.pack is not None:
                    self.stats._reused_packs[ref.digest] = stored.pack
                self._claimed[ref.digest] = stored
            return stored
        if self._packs is not None:
            written = self._packs.append(ref, piece)
        else:
            self.storage.put(chunk_key(ref.digest), piece, sync_parent=False)
            written = ref
        with self._lock:
            self.stats.bytes_written += len(piece)
            if first:
                self._claimed[ref.digest] = written
        return written

    def _stored(self, ref: ChunkRef) -> ChunkRef | None:
        """Where the store holds these bytes already. A stored copy of another size is damaged (truncated,
        zeroed): they are written again."""
        if self._packs is not None:
            with self._lock:
                if self._packed is None:  # once per save, by the first thread here
                    self._packed = packed_chunks(self.storage)
            packed = self._packed.get(ref.digest)
            if packed is not None and packed.size == ref.size and self._pack_holds(packed):
                return packed
        stored = self.storage.stat(chunk_key(ref.digest))
        return ref if stored is not None and stored.size == ref.size else None

    def _pack_holds(self, ref: ChunkRef) -> bool:
        """The chunk's pack is there and long enough (a truncated pack is damaged: written again)."""
        with self._lock:
            size = self._pack_sizes.get(ref.pack)
        if size is None:
            info = self.storage.stat(pack_key(ref.pack))
            size = info.size if info is not None else -1
            with self._lock:
                self._pack_sizes[ref.pack] = size
        return size >= ref.offset + ref.size

    def holds(self, ref: ChunkRef, piece: memoryview) -> bool:
        """PIECE is kept for the save's re-check (its chunk was found stored: written again from it if a GC
        takes that meanwhile), so its memory may not be reused yet."""
        with self._lock:
            return self.stats._reused.get(ref.digest) is piece

    def close(self) -> None:
        """Seal the packs this save wrote to (every put has returned)."""
        if self._packs is not None:
            self._packs.close()

    def abort(self) -> None:
        if self._packs is not None:
            self._packs.abort()


@dataclass
class WrittenChunks:
    """Everything but the manifest: chunk references plus what it cost."""

    skeleton: ChunkRef | None
    tensors: list[TensorRef]
    files: dict[str, FileRef]
    stats: SaveStats


def write_chunks(
    storage: Storage,
    *,
    skeleton: bytes | None = None,
    blobs: Sequence[Blob] = (),
    files: dict[str, Path] | None = None,
    workers: int = WRITE_WORKERS,
    pacer: Pacer | None = None,
    stats: SaveStats | None = None,
) -> WrittenChunks:
    """Hash, deduplicate and durably write every chunk (in parallel, at `pacer`'s pace); no manifest yet.
    `stats`: a save's figures so far, which this part adds to (save_sharded: its DCP files' chunks)."""
    if skeleton is not None and len(skeleton) > MAX_CHUNK_BYTES:  # one chunk, which readers bound
        raise CheckpointError(
            f"the state's non-tensor part takes {len(skeleton)} bytes, more than the {MAX_CHUNK_BYTES} a "
            "checkpoint can hold: keep large data in tensors or numpy arrays"
        )
    stats = stats if stats is not None else SaveStats()
    pacer = pacer or Pacer()
    sink = ChunkSink(storage, stats, pacer)
    started = time.monotonic()
    mapped: list[mmap.mmap] = []
    try:
        file_views = {name: _map_file(Path(path), mapped) for name, path in sorted((files or {}).items())}
        pacer.plan(
            len(skeleton or b"") + sum(blob.data.nbytes for blob in blobs) + sum(v.nbytes for v in file_views.values())
        )
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tp-ckpt-write") as pool:
            skeleton_future = pool.submit(sink.put, memoryview(skeleton)) if skeleton is not None else None
            tensor_plan = _plan_tensors(blobs)
            by_piece: dict[int, Future] = {}  # a pack shared by many tensors is hashed once

            def submit(piece: memoryview) -> Future:
                if id(piece) not in by_piece:
                    by_piece[id(piece)] = pool.submit(sink.put, piece)
                return by_piece[id(piece)]

            tensor_futures = [[submit(piece) for piece in pieces] for pieces, _ in tensor_plan]
            file_futures = {
                name: [pool.submit(sink.put, piece) for piece in _pieces(view)] for name, view in file_views.items()
            }
            written = WrittenChunks(
                skeleton=skeleton_future.result() if skeleton_future else None,
                tensors=[
                    TensorRef(
                        dtype=blob.dtype,
                        shape=blob.shape,
                        size=len(blob.data),
                        offset=offset,
                        chunks=[f.result() for f in futures],
                    )
                    for blob, futures, (_, offset) in zip(blobs, tensor_futures, tensor_plan, strict=True)
                ],
                files={
                    name: FileRef(size=sum(f.result().size for f in futs), chunks=[f.result() for f in futs])
                    for name, futs in file_futures.items()
                },
                stats=stats,
            )
        sink.close()
        if pacer.paced:
            stats.paced_idle_seconds = max(0.0, time.monotonic() - started - pacer.busy_seconds)
        storage.sync("chunks")  # the renames of the save's chunks and packs, durable
        storage.sync(PACKS)
        return written
    except BaseException:
        sink.abort()
        raise
    finally:
        for handle in mapped:
            with contextlib.suppress(BufferError):  # a reused piece still refers to it; freed with it
                handle.close()


def settle_seconds(requested: float) -> float:
    return max(requested, MIN_SETTLE_SECONDS)


def lease_reused(storage: Storage, run_id: str, step: int, names: set[str], stats: SaveStats) -> str | None:
    """List the chunks (and packs: manifest.stored_names) this save references in a lease, when it reused any;
    returns the lease key."""
    if not stats._reused:
        return None
    key = lease_key(uuid.uuid4().hex)
    storage.put(key, json.dumps({"run_id": run_id, "step": step, "chunks": sorted(names)}).encode())
    return key


def recheck_reused(storage: Storage, stats: SaveStats) -> None:
    """After the settle: write again each reused chunk a concurrent GC removed meanwhile."""
    for digest, piece in stats._reused.items():
        pack = stats._reused_packs.get(digest)
        if storage.exists(pack_key(pack) if pack else chunk_key(digest)):
            continue
        if piece is None:
            raise CheckpointError(
                f"chunk {digest}, which this save found already stored, was deleted by a garbage collection "
                "while the save settled, after its snapshot was released; this checkpoint is not published "
                "(the previous one stays) and the next save writes the chunk again"
            )
        storage.put(chunk_key(digest), piece)  # on its own: readers look there when its pack is gone
    stats._reused.clear()
    stats._reused_packs.clear()


def protect_reused(
    storage: Storage,
    run_id: str,
    step: int,
    names: set[str],
    stats: SaveStats,
    settle: float = LEASE_SETTLE_SECONDS,
) -> str | None:
    """Lease the chunks this save references, then re-check those it did not write (see retention.py).

    Returns the lease key, to delete once the manifest is written (None when nothing was reused).
    """
    key = lease_reused(storage, run_id, step, names, stats)
    if key:
        time.sleep(settle_seconds(settle))
        recheck_reused(storage, stats)
    return key


def publish(
    storage: Storage,
    manifest: CheckpointManifest,
    signer: ManifestSigner,
    leases: Sequence[str | None] = (),
    visible_if: Callable[[], bool] | None = None,
) -> CheckpointManifest:
    """Seal, sign and write the manifest (the moment the checkpoint becomes visible), then drop leases.
    `visible_if`: asked once the manifest is durable, right before it becomes visible (Storage.put)."""
    manifest = signer.seal(manifest.with_format())
    body = manifest.model_dump_json(indent=1).encode()
    storage.put(manifest_key(manifest.run_id, manifest.step), body, visible_if=visible_if)
    for lease in leases:
        if lease:
            storage.delete(lease)
    return manifest


@dataclass
class StagedCheckpoint:
    """A checkpoint whose chunks are written and whose reused chunks are leased; `finish` lets
    the lease settle, re-checks them and publishes the manifest."""

    storage: Storage
    signer: ManifestSigner
    manifest: CheckpointManifest
    stats: SaveStats
    lease: str | None
    settled_at: float
    """monotonic time from which the reused chunks can be re-checked"""
    started: float
    caller_waits: bool = False
    """the caller waits for the whole save (a synchronous save): all of it, settle included, is its stall, and
    none of it background"""

    def release_snapshot(self) -> None:
        """Drop the references into the caller's buffer, which it is about to reuse: a reused
        chunk removed while this save settles then fails the save instead of being rewritten."""
        self.stats._reused = dict.fromkeys(self.stats._reused)

    def finish(self, still_wanted: Callable[[], bool] | None = None) -> CheckpointManifest:
        """`still_wanted`, asked right before the manifest goes out: False abandons the save (its chunks
        are left to GC)."""
        settle = max(0.0, self.settled_at - time.monotonic())
        time.sleep(settle)
        try:
            recheck_reused(self.storage, self.stats)
            stats, took = self.stats, time.monotonic() - self.started
            if self.caller_waits:  # all stall, none background, as a synchronous sharded save records it
                stats.stall_seconds, stats.background_seconds = took, 0.0
            else:
                # Work, not waiting: the settle and the pace cost nobody anything. `every_steps: auto` takes
                # stall plus background as what a save costs the loop.
                stats.background_seconds = took - settle - stats.paced_idle_seconds
            self.manifest.save = SaveRecord(
                bytes_written=stats.bytes_written,
                bytes_deduplicated=stats.bytes_deduplicated,
                stall_seconds=stats.stall_seconds,
                background_seconds=stats.background_seconds,
            )
            abandoned = CheckpointError(
                f"checkpoint step {self.manifest.step} of run {self.manifest.run_id} was abandoned before "
                "its manifest: the process that asked for it is gone"
            )
            if still_wanted is not None and not still_wanted():
                raise abandoned
            try:
                # Asked again once the manifest is durable: its fsync takes milliseconds, in which a trainer killed
                # meanwhile (its job reported failed) would still get its checkpoint.
                return publish(self.storage, self.manifest, self.signer, [self.lease], visible_if=still_wanted)
            except NotWanted:
                raise abandoned from None
        except Exception:
            if self.lease:  # a lease left behind would keep the chunks from GC for a day
                with contextlib.suppress(Exception):  # the error that matters is the one raised
                    self.storage.delete(self.lease)
            raise


def stage_checkpoint(
    storage: Storage,
    run_id: str,
    step: int,
    *,
    signer: ManifestSigner,
    skeleton: bytes | None = None,
    blobs: Sequence[Blob] = (),
    files: dict[str, Path] | None = None,
    metrics: dict[str, float] | None = None,
    attributes: dict[str, str | int | float] | None = None,
    stall_seconds: float | None = 0.0,
    workers: int = WRITE_WORKERS,
    lease_settle_seconds: float = LEASE_SETTLE_SECONDS,
    pacer: Pacer | None = None,
) -> StagedCheckpoint:
    """Write the chunks (at `pacer`'s pace) and lease the reused ones; the manifest comes with `finish`.

    `stall_seconds`: what the save cost the caller's loop; None: the caller waits for all of it (measured).
    """
    started = time.monotonic()
    manifest_key(run_id, step)  # refuse a bad run id before writing anything
    written = write_chunks(storage, skeleton=skeleton, blobs=blobs, files=files, workers=workers, pacer=pacer)
    written.stats.stall_seconds = stall_seconds or 0.0
    manifest = CheckpointManifest(
        run_id=run_id,
        step=step,
        kind="files" if files else "state",
        skeleton=written.skeleton,
        tensors=written.tensors,
        files=written.files,
        metrics=metrics or {},
        attributes=attributes or {},
    )
    lease = lease_reused(storage, run_id, step, stored_names(manifest.chunks), written.stats)
    settle = settle_seconds(lease_settle_seconds) if lease else 0.0
    return StagedCheckpoint(
        storage, signer, manifest, written.stats, lease, time.monotonic() + settle, started, stall_seconds is None
    )


def write_checkpoint(storage: Storage, run_id: str, step: int, **options: Any) -> tuple[CheckpointManifest, SaveStats]:
    """Write chunks, then the manifest; returns the sealed manifest (uri unset) and stats.

    Options: those of `stage_checkpoint`.
    """
    staged = stage_checkpoint(storage, run_id, step, **options)
    return staged.finish(), staged.stats


def _plan_tensors(blobs: Sequence[Blob]) -> list[tuple[list[memoryview], int]]:
    """For each blob: the pieces holding its bytes and its offset in the first piece.

    Small blobs share pack buffers (consecutive small tensors, in state order, so an
    unchanged group of them yields an identical pack and deduplicates).
    """
    plan: list[tuple[list[memoryview], int] | None] = [None] * len(blobs)
    pack: list[int] = []
    pack_bytes = 0

    def flush() -> None:
        nonlocal pack, pack_bytes
        if not pack:
            return
        buffer = bytearray(pack_bytes)
        offset = 0
        for index in pack:
            data = blobs[index].data
            buffer[offset : offset + len(data)] = data
            plan[index] = ([], offset)
            offset += len(data)
        view = memoryview(buffer)
        for index in pack:
            plan[index] = ([view], plan[index][1])
        pack, pack_bytes = [], 0

    for index, blob in enumerate(blobs):
        size = len(blob.data)
        if size >= PACK_BELOW_BYTES:
            plan[index] = (_pieces(blob.data), 0)
            continue
        if pack_bytes + size > PACK_BYTES:
            flush()
        pack.append(index)
        pack_bytes += size
    flush()
    return plan


def _pieces(view: memoryview) -> list[memoryview]:
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if not len(view):
        return [view]
    return [view[i : i + CHUNK_BYTES] for i in range(0, len(view), CHUNK_BYTES)]


def _map_file(path: Path, mapped: list[mmap.mmap]) -> memoryview:
    with open(path, "rb") as handle:
        size = path.stat().st_size
        if size == 0:
            return memoryview(b"")
        handle_map = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
    mapped.append(handle_map)
    return memoryview(handle_map)
