"""DCP's files go straight into the store's chunks (dcp_chunks.py): the same chunks a staged file made, pieces
kept for a save's re-check are never overwritten, and a store that fails a write fails the save. A restore reads
only the chunks holding what it loads, straight from the store."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from training_platform.checkpoints import dcp_chunks, open_store, writer
from training_platform.checkpoints.dcp_chunks import StoredFiles
from training_platform.checkpoints.layout import chunk_key
from training_platform.checkpoints.manifest import chunk_digest
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.reader import ChunkReader
from training_platform.checkpoints.sharded import load_sharded, restore_latest_sharded, save_sharded
from training_platform.checkpoints.writer import ChunkSink, SaveStats, write_chunks
from training_platform.errors import CheckpointError

PIECE = 64 << 10


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 64 KiB, so a state of a few hundred KiB makes files of several pieces."""
    monkeypatch.setattr(writer, "CHUNK_BYTES", PIECE)
    monkeypatch.setattr(dcp_chunks, "CHUNK_BYTES", PIECE)


def state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(10_000 + i, generator=generator) for i in range(12)} | {"step": seed}


def test_a_file_written_through_the_store_has_the_chunks_of_the_same_file_staged_on_disk(tmp_path):
    staged = tmp_path / "staged"
    dcp.save(state(1), storage_writer=dcp.FileSystemWriter(str(staged), sync_files=False))
    on_disk = write_chunks(open_store(tmp_path / "a").storage, files={p.name: p for p in staged.iterdir()})

    store = open_store(tmp_path / "b")
    files = dcp_chunks.ChunkedFiles(ChunkSink(store.storage, SaveStats(), Pacer()))
    try:
        dcp.save(state(1), storage_writer=files.writer())
    finally:
        files.close()

    assert set(files.files) == set(on_disk.files) == {"__0_0.distcp", ".metadata"}
    shard = files.files["__0_0.distcp"]
    chunks = lambda ref: [(chunk.digest, chunk.size) for chunk in ref.chunks]  # noqa: E731 - not where they lie
    assert len(shard.chunks) > 3 and chunks(shard) == chunks(on_disk.files["__0_0.distcp"])
    # .metadata holds a save id of its own and the directory's path (none here): its own small chunk.
    assert len(files.files[".metadata"].chunks) == 1 and 0 < files.files[".metadata"].size < PIECE


def test_a_sharded_save_restores_and_a_second_save_of_the_same_state_writes_nothing(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    first = save_sharded(store, "r", 1, state(1))
    second = save_sharded(store, "r", 2, state(1) | {"step": 1})
    shard = second.files["__0_0.distcp"]
    assert first.save.bytes_written > 12 * 40_000 and second.save.bytes_written < 2 * PIECE
    assert second.save.bytes_deduplicated >= shard.size - PIECE

    target = {key: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for key, v in state(1).items()}
    read = []
    original = ChunkReader.read
    monkeypatch.setattr(ChunkReader, "read", lambda self, ref: read.append(ref.digest) or original(self, ref))
    manifest, _ = restore_latest_sharded(store, "r", target)
    assert manifest.step == 2
    assert sorted(d for d in read if d in {c.digest for c in shard.chunks}) == sorted(c.digest for c in shard.chunks)
    assert all(torch.equal(target[key], value) for key, value in state(1).items() if isinstance(value, torch.Tensor))


def test_the_pieces_a_save_keeps_for_its_recheck_are_not_reused_for_the_next(tmp_path):
    store = open_store(tmp_path / "store")
    save_sharded(store, "r", 1, state(1))
    stats = SaveStats()
    files = dcp_chunks.ChunkedFiles(ChunkSink(store.storage, stats, Pacer()), workers=1)
    try:
        dcp.save(state(1) | {"step": 2}, storage_writer=files.writer())
    finally:
        files.close()
    kept = {digest: piece for digest, piece in stats._reused.items() if piece is not None}
    assert len(kept) > 3  # every piece but the last of the shard was stored already
    # Were a kept piece's buffer handed to the next piece, its bytes would be the next piece's now.
    assert all(chunk_digest(piece) == digest for digest, piece in kept.items())


def test_a_store_that_fails_a_write_fails_the_save_and_publishes_nothing(tmp_path, monkeypatch, loose_chunks):
    store = open_store(tmp_path / "store")
    original = type(store.storage).put
    written = []

    def put(self, key, data, **kwargs):
        if key.startswith("chunks/") and written:
            raise OSError(28, "No space left on device")
        written.append(key)
        return original(self, key, data, **kwargs)

    monkeypatch.setattr(type(store.storage), "put", put)
    with pytest.raises(CheckpointError, match="step 1 was not written: rank 0: OSError: .*No space left on device"):
        save_sharded(store, "r", 1, state(1))
    assert store.list("r") == []


def test_a_restore_reads_only_the_chunks_that_hold_what_it_loads(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    manifest = save_sharded(store, "r", 1, state(1))
    shard = manifest.files["__0_0.distcp"]
    read = []
    original = ChunkReader.read
    monkeypatch.setattr(ChunkReader, "read", lambda self, ref: read.append(ref.digest) or original(self, ref))

    target = {"layer0": torch.zeros(10_000)}  # the first tensor in the shard
    load_sharded(store, manifest, target)

    assert torch.equal(target["layer0"], state(1)["layer0"])
    shard_read = [digest for digest in read if digest in {chunk.digest for chunk in shard.chunks}]
    # Its chunks (one or two) and the next ones, read ahead.
    assert 1 <= len(shard_read) <= 2 + StoredFiles.READ_AHEAD < len(shard.chunks)
    assert len(shard_read) == len(set(shard_read))  # each fetched once


def test_a_damaged_chunk_fails_the_restore_that_needs_it_and_only_that_one(tmp_path, loose_chunks):
    store = open_store(tmp_path / "store")
    manifest = save_sharded(store, "r", 1, state(1))
    last = manifest.files["__0_0.distcp"].chunks[-1]
    (tmp_path / "store" / chunk_key(last.digest)).write_bytes(b"\0" * last.size)

    first = {"layer0": torch.zeros(10_000)}
    load_sharded(store, manifest, first)  # the first tensor in the shard
    assert torch.equal(first["layer0"], state(1)["layer0"])

    with pytest.raises(CheckpointError, match=rf"does not load: rank 0: chunk .*{last.digest} does not match"):
        load_sharded(store, manifest, {"layer11": torch.zeros(10_011)})  # the last
    assert (tmp_path / "store" / "quarantine").is_dir()


def test_a_paced_sharded_save_counts_its_work_not_its_pace(tmp_path):
    store = open_store(tmp_path / "store")
    started = time.monotonic()
    manifest = save_sharded(store, "r", 1, state(1), stall_seconds=0.01, pacer=Pacer(seconds=3.0))
    took = time.monotonic() - started
    assert took >= 2.0  # its pieces were spread over the pace
    # `every_steps: auto` reads this as the save's cost: a paced save would otherwise look as slow as its pace.
    assert manifest.save.stall_seconds == 0.01 and manifest.save.background_seconds < took / 2
