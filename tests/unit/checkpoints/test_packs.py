"""Packs (packs.py): a save to a filesystem appends its new chunks to a few large files. The chunks keep
their identity (dedup across saves and runs), damage is caught and repaired, and GC takes a pack whole once
nothing reads a chunk from it."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store, packs, retention
from training_platform.checkpoints.layout import chunk_key, pack_index_key, pack_key, parse_trash_key, trash_key
from training_platform.checkpoints.manifest import FORMAT_VERSION, UNPACKED_FORMAT
from training_platform.checkpoints.packs import read_pack_index
from training_platform.checkpoints.retention import STALE_TRASH_SECONDS, storage_now
from training_platform.checkpoints.storage import AppendedObject
from training_platform.errors import CheckpointError

GRACE = 3600.0


def state(seed: int = 0, frozen: float = 1.0) -> dict:
    """12 chunks of 4 KiB with small_chunks: eight frozen layers, four that change with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    layers = {f"frozen{i}": torch.full((1024,), frozen + i) for i in range(8)}
    return layers | {f"trained{i}": torch.randn(1024, generator=generator) for i in range(4)} | {"seed": seed}


@pytest.fixture
def store(tmp_path, small_chunks, monkeypatch) -> CheckpointStore:
    monkeypatch.setattr(packs, "PACK_TARGET_BYTES", 16 << 10)  # four chunks a pack
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def pack_files(store: CheckpointStore) -> set[str]:
    return {info.key.removeprefix("packs/") for info in store.storage.list_info("packs") if "." not in info.key}


def stored_files(store: CheckpointStore) -> list[str]:
    root = store.storage.root
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def assert_restores(store: CheckpointStore, run_id: str, expected: dict) -> None:
    restored = store.restore_latest(run_id)
    assert restored is not None and not restored.skipped, restored and restored.skipped
    for name, value in expected.items():
        same = (
            torch.equal(restored.state[name], value)
            if isinstance(value, torch.Tensor)
            else restored.state[name] == value
        )
        assert same, name


def assert_loads(store: CheckpointStore, manifest, expected: dict) -> None:
    loaded = store.load(manifest)
    assert all(
        torch.equal(loaded[k], v) if isinstance(v, torch.Tensor) else loaded[k] == v for k, v in expected.items()
    )


def age(store: CheckpointStore, key: str) -> None:
    """Date an object before GC's grace period."""
    path = store.storage.root / key
    old = path.stat().st_mtime - 2 * GRACE
    os.utime(path, (old, old))


def test_a_save_writes_its_chunks_to_a_few_packs_and_restores_bitwise(store):
    manifest, stats = store.save("r", 1, state())

    located = [ref for ref in manifest.chunks if ref.size >= 4096]
    assert len(located) == 12 and all(ref.pack is not None for ref in located)
    assert store.storage.list("chunks") == []  # nothing on its own
    assert 1 < len(pack_files(store)) < len(manifest.chunks)
    assert manifest.format_version == FORMAT_VERSION and stats.bytes_written >= 12 * 4096
    for pack in pack_files(store):  # each index says where its chunks lie, and they are there
        data = (store.storage.root / pack_key(pack)).read_bytes()
        for ref in read_pack_index(store.storage, pack):
            assert ref.matches(data[ref.offset : ref.offset + ref.size])
    assert_restores(store, "r", state())


def test_a_store_without_packs_writes_the_format_builds_before_packs_read(store, loose_chunks):
    manifest, _ = store.save("r", 1, state())
    assert manifest.format_version == UNPACKED_FORMAT and not pack_files(store)
    assert all(ref.pack is None for ref in manifest.chunks)


def test_chunks_in_packs_are_reused_by_later_saves_and_other_runs(store):
    store.save("r", 1, state(seed=1))
    second, stats = store.save("r", 2, state(seed=2))
    assert stats.bytes_written < 5 * 4096 and stats.bytes_deduplicated >= 8 * 4096  # only the trained layers
    _, other_run = store.save("other", 1, state(seed=1))
    assert other_run.bytes_written < 4096  # the state run r saved first, from another run: its skeleton at most
    assert_restores(store, "r", state(seed=2))
    assert_restores(store, "other", state(seed=1))


def test_a_damaged_packed_chunk_fails_its_restore_until_the_next_save_writes_it_again(store):
    first, _ = store.save("r", 1, state())
    ref = next(ref for ref in first.chunks if ref.size == 4096)
    path = store.storage.root / pack_key(ref.pack)
    with open(path, "r+b") as handle:  # zeroed in place: sizes still match
        handle.seek(ref.offset)
        handle.write(bytes(ref.size))

    with pytest.raises(CheckpointError, match=f"{ref.pack} at byte {ref.offset} does not match its blake3 hash"):
        store.load(first)
    [quarantined] = store.storage.list("quarantine")
    assert store.storage.get(quarantined) == bytes(ref.size)  # kept for inspection
    assert ref.digest not in {entry.digest for entry in read_pack_index(store.storage, ref.pack)}

    second, stats = store.save("r", 2, state())
    assert stats.bytes_written >= ref.size  # not reused from the damaged pack
    moved = next(entry for entry in second.chunks if entry.digest == ref.digest)
    assert moved.pack != ref.pack
    assert_restores(store, "r", state())
    assert_loads(store, first, state())  # step 1 reads the new copy


def test_a_truncated_pack_fails_the_restores_that_need_it_and_is_not_reused(store):
    first, _ = store.save("r", 1, state())
    ref = max(first.chunks, key=lambda chunk: (chunk.pack or "", chunk.offset))  # the last of its pack
    os.truncate(store.storage.root / pack_key(ref.pack), ref.offset + 10)

    with pytest.raises(CheckpointError, match="does not match its size"):
        store.load(first)
    _, stats = store.save("r", 2, state())
    assert stats.bytes_written >= ref.size  # written again, not reused from where it is cut
    assert_restores(store, "r", state())
    assert_loads(store, first, state())  # step 1 reads the chunk's new copy


def test_a_chunk_whose_pack_is_gone_is_read_on_its_own(store):
    manifest, _ = store.save("r", 1, state())
    pack = next(ref.pack for ref in manifest.chunks if ref.pack)
    data = (store.storage.root / pack_key(pack)).read_bytes()
    for ref in read_pack_index(store.storage, pack):  # as a save's re-check writes a chunk whose pack GC took
        store.storage.put(chunk_key(ref.digest), data[ref.offset : ref.offset + ref.size])
    store.storage.delete(pack_key(pack))

    assert store.restorable(manifest)
    assert_restores(store, "r", state())


def test_gc_takes_a_pack_no_manifest_or_lease_reads_from_and_keeps_one_that_is(store):
    store.save("r", 1, state(seed=1))
    first_packs = pack_files(store)
    store.save("r", 2, state(seed=2))  # its new packs hold only its trained layers
    second_packs = pack_files(store) - first_packs
    kept, _ = store.save("r", 3, state(seed=3))
    store.prune("r", keep_last=1)
    for key in store.storage.list("packs"):
        age(store, key)
    store.storage.put("leases/in-progress.json", json.dumps({"chunks": []}).encode())

    report = store.gc(grace_seconds=GRACE)

    assert pack_files(store) == {ref.pack for ref in kept.chunks}  # step 3 reads its frozen layers from step 1's
    assert second_packs and second_packs.isdisjoint(pack_files(store))
    assert set(report.deleted) >= second_packs and report.deleted_bytes >= 4 * 4096
    indexes = {key for key in store.storage.list("packs") if key.endswith(".json")}
    assert indexes == {pack_index_key(pack) for pack in pack_files(store)}
    assert_restores(store, "r", state(seed=3))


def test_a_lease_keeps_a_pack_and_another_copy_of_its_bytes_does_not(store):
    store.save("r", 1, state())
    store.storage.delete(f"runs/r/{1:012d}.json")  # nothing reads from step 1's packs now
    leased, *others = sorted(pack_files(store))
    # A save that reads from one pack, and found the other packs' chunks elsewhere (on their own): it names
    # their digests, not those packs.
    copies = [ref.digest for pack in others for ref in read_pack_index(store.storage, pack)]
    store.storage.put("leases/save.json", json.dumps({"chunks": [leased, *copies]}).encode())
    for key in store.storage.list("packs"):
        age(store, key)

    store.gc(grace_seconds=GRACE)

    assert pack_files(store) == {leased}


def test_what_a_dead_gc_left_aside_is_read_from_there_and_settled_by_the_next_gc(store):
    manifest, _ = store.save("r", 1, state())
    storage = store.storage
    aside = {}
    for pack in pack_files(store):  # as a GC that died between setting them aside and deleting them
        aside[pack] = trash_key(pack, storage_now(storage) - 2 * STALE_TRASH_SECONDS, "deadgc")
        storage.move(pack_key(pack), aside[pack])
    assert_restores(store, "r", state())  # read from trash/

    store.gc(grace_seconds=GRACE)

    assert pack_files(store) == set(aside) and storage.list("trash") == []  # named: put back
    assert_restores(store, "r", state())


def test_a_pack_write_that_fails_fails_the_save_and_leaves_nothing(store, monkeypatch):
    store.save("r", 1, state())
    before = stored_files(store)
    original = AppendedObject.append

    def append(self, data):
        if self.size:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, data)

    monkeypatch.setattr(AppendedObject, "append", append)
    with pytest.raises(OSError, match="No space left"):
        store.save("r", 2, state(seed=5))
    assert [m.step for m in store.list("r")] == [1]
    assert stored_files(store) == before  # no pack, index or temporary left behind


def test_a_gc_that_dies_between_its_two_deletes_leaves_a_pack_in_trash_never_an_index_without_its_pack(
    store, monkeypatch
):
    """A pack GC takes loses its index first, then its bytes. One that died in between left a pack in trash/
    that the next GC deletes as named by nothing; an index whose pack is gone is never left for a sweep (one
    took the indexes of kept packs that other GCs set aside and put back while it listed)."""
    store.save("r", 1, state())
    storage = store.storage
    store.storage.delete(f"runs/r/{1:012d}.json")  # nothing reads from its packs now
    for key in storage.list("packs"):
        age(store, key)
    packs_before = pack_files(store)
    deleted = storage.delete

    def dies_at_a_trash_delete(key: str) -> None:
        if key.startswith("trash/"):
            raise KeyboardInterrupt("the GC's process was killed")  # not an OSError: nothing handles it
        deleted(key)

    monkeypatch.setattr(storage, "delete", dies_at_a_trash_delete)
    with pytest.raises(KeyboardInterrupt):
        store.gc(grace_seconds=GRACE)
    monkeypatch.setattr(storage, "delete", deleted)
    indexes = {key for key in storage.list("packs") if key.endswith(".json")}
    in_trash = {parse_trash_key(key)[0] for key in storage.list("trash")}
    assert in_trash and in_trash <= packs_before  # set aside: the one it was deleting, and the rest of its round
    assert indexes <= {pack_index_key(pack) for pack in pack_files(store) | in_trash}  # none without its pack
    assert len(in_trash) - len(indexes) == 1  # the one it was deleting has lost only its index

    monkeypatch.setattr(retention, "STALE_TRASH_SECONDS", 0.0)  # what the dead GC left is old enough now
    store.gc(grace_seconds=GRACE)

    assert storage.list("trash") == [] and pack_files(store).isdisjoint(packs_before)
    assert [key for key in storage.list("packs") if key.endswith(".json")] == []
