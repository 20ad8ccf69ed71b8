"""GC racing saves: 200 saves while another thread collects, then every kept checkpoint restores.

Each save holds three kinds of chunk:
- `aged`: left in the store as garbage older than the grace period just before the save, so the
  save deduplicates against a chunk GC wants to delete (the case the lease protocol is for); half
  of them on their own, half in a pack (packs.py), which GC takes whole;
- `fresh`: written by the save, protected only by the grace period until its lease or manifest;
- `shared`: the same bytes in every save, always referenced by some kept checkpoint.

A collector thread runs GC the whole time. On top of that race, each save that finds its `aged`
chunk stored forces one of the two worst interleavings with a collection of its own: right after
that dedup check (GC deletes the chunk before the lease exists: the save must write it again), or
right after the save's re-check, before its manifest is out (the chunk is only leased: GC must
keep it). New chunks go to packs, as on any filesystem. The protocol's own timings are kept
(settle 0.5 s > GC's 0.3 s delete window); saves
run in parallel threads, one per run.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from training_platform.checkpoints import RetentionPolicy, writer
from training_platform.checkpoints.layout import chunk_key, pack_index_key, pack_key
from training_platform.checkpoints.manifest import ChunkRef, chunk_digest
from training_platform.checkpoints.packs import PackWriter, read_pack_index
from training_platform.checkpoints.retention import GC_DELETE_WINDOW_SECONDS
from training_platform.checkpoints.serialization import byte_view, tensor_blob
from training_platform.checkpoints.storage import LocalStorage, ObjectInfo
from training_platform.checkpoints.store import CheckpointStore

RUNS = 8
SAVES_PER_RUN = 25  # 200 saves in all
KEEP = RetentionPolicy(keep_last=2)
GRACE = 3600.0
SHARED = torch.arange(1024, dtype=torch.float32)


def state(index: int) -> dict:
    return {
        "aged": torch.full((1024,), float(index)),
        "fresh": torch.full((1024,), -float(index) - 1),
        "shared": SHARED,
        "index": index,
    }


class InterleavingStorage(LocalStorage):
    """A local tier that runs a whole GC at the two moments named in the module docstring."""

    def __init__(self, root):
        super().__init__(root)
        self.collect = None
        self.after_stat: set[str] = set()
        self.after_recheck: set[str] = set()
        self.forced: list = []

    def stat(self, key: str) -> ObjectInfo | None:
        info = super().stat(key)
        if info is not None and key in self.after_stat:
            self.after_stat.discard(key)
            self.forced.append(("deleted before the lease", key, self.collect()))
        return info

    def exists(self, key: str) -> bool:
        found = super().exists(key)
        if found and key in self.after_recheck:  # the save's re-check, the last look before its manifest
            self.after_recheck.discard(key)
            self.forced.append(("while only leased", key, self.collect()))
        return found


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "CHUNK_BYTES", 4096)  # 4 KiB tensors: one chunk each, none packed
    monkeypatch.setattr(writer, "PACK_BELOW_BYTES", 1024)
    storage = InterleavingStorage(tmp_path / "store")
    store = CheckpointStore(storage, lease_settle_seconds=writer.MIN_SETTLE_SECONDS)
    assert store.lease_settle_seconds > GC_DELETE_WINDOW_SECONDS  # the protocol's own margin
    storage.collect = lambda: store.gc(grace_seconds=GRACE)
    looked_up = writer.packed_chunks

    def packed_chunks(storage: InterleavingStorage):  # a save's look at the packs is its dedup check
        found = looked_up(storage)
        for pack in {ref.pack for ref in found.values()} & storage.after_stat:
            storage.after_stat.discard(pack)
            storage.forced.append(("deleted before the lease", pack, storage.collect()))
        return found

    monkeypatch.setattr(writer, "packed_chunks", packed_chunks)
    return store


def leave_as_old_garbage(storage: LocalStorage, tensor: torch.Tensor, packed: bool) -> str:
    """Store the tensor's chunk with no manifest naming it, dated before the grace period; returns the key
    (its pack's id when packed)."""
    ref = ChunkRef(digest=chunk_digest(byte_view(tensor)), size=tensor.numel() * tensor.element_size())
    if packed:
        pack = PackWriter(storage)
        ref = pack.append(ref, tensor_blob(tensor).data)
        pack.close()
        paths = [storage.root / pack_key(ref.pack), storage.root / pack_index_key(ref.pack)]
    else:
        LocalStorage.put(storage, chunk_key(ref.digest), tensor_blob(tensor).data)
        paths = [storage.root / chunk_key(ref.digest)]
    old = paths[0].stat().st_mtime - 2 * GRACE
    for path in paths:
        os.utime(path, (old, old))
    return ref.pack if packed else chunk_key(ref.digest)


def test_two_hundred_saves_racing_gc_leave_every_kept_checkpoint_restorable(store):
    storage: InterleavingStorage = store.storage
    stop = threading.Event()
    collected: list = []
    errors: list[BaseException] = []
    saved: list[int] = []

    def collect() -> None:
        while not stop.is_set():
            try:
                collected.append(store.gc(grace_seconds=GRACE))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return

    def save_run(run: int) -> None:
        try:
            for save in range(SAVES_PER_RUN):
                index, step = run * SAVES_PER_RUN + save, save + 1
                key = leave_as_old_garbage(storage, state(index)["aged"], packed=index % 4 >= 2)
                if index % 2:
                    storage.after_stat.add(key)
                else:
                    storage.after_recheck.add(pack_key(key) if index % 4 >= 2 else key)
                store.save(f"run-{run}", step, state(index))
                saved.append(step)
                store.apply_retention(f"run-{run}", KEEP)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    collector = threading.Thread(target=collect)
    savers = [threading.Thread(target=save_run, args=(run,)) for run in range(RUNS)]
    collector.start()
    for saver in savers:
        saver.start()
    for saver in savers:
        saver.join()
    stop.set()
    collector.join()

    assert errors == []
    assert len(saved) == RUNS * SAVES_PER_RUN
    # Both sides acted: collections freed chunks, and the forced interleavings happened.
    forced = [report for _, _, report in storage.forced]
    assert sum(report.deleted_chunks for report in collected + forced) > 0
    kinds = {(why, key.startswith("chunks/")) for why, key, _ in storage.forced}
    moments = ("deleted before the lease", "while only leased")
    assert kinds == {(why, alone) for why in moments for alone in (True, False)}

    def every_kept_checkpoint_restores() -> None:
        for run in range(RUNS):
            kept = store.list(f"run-{run}")
            assert [m.step for m in kept] == [SAVES_PER_RUN - 1, SAVES_PER_RUN]
            for manifest in kept:
                restored = store.load(manifest)
                expected = state(run * SAVES_PER_RUN + manifest.step - 1)
                assert restored["index"] == expected["index"]
                for name in ("aged", "fresh", "shared"):
                    assert torch.equal(restored[name], expected[name]), (run, manifest.step, name)

    every_kept_checkpoint_restores()
    # Once nothing is in flight, everything but the kept checkpoints' chunks goes, and they still restore.
    store.gc(grace_seconds=0)
    kept = [ref for run in range(RUNS) for m in store.list(f"run-{run}") for ref in m.chunks]
    packs = {info.key.removeprefix("packs/") for info in storage.list_info("packs") if "." not in info.key}
    alone = {info.key.removeprefix("chunks/") for info in storage.list_info("chunks")}
    in_packs = {ref.digest for pack in packs for ref in read_pack_index(storage, pack)}
    assert {ref.digest for ref in kept} <= alone | in_packs
    assert packs <= {ref.pack for ref in kept}  # each pack left is where a kept checkpoint reads a chunk
    assert alone <= {ref.digest for ref in kept}
    assert {info.key for info in storage.list_info("packs") if "." in info.key} == {pack_index_key(p) for p in packs}
    every_kept_checkpoint_restores()
