"""DCP's files go straight into the store's chunks (dcp_chunks.py): the same chunks a staged file made, pieces
kept for a save's re-check are never overwritten, and a store that fails a write fails the save."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from training_platform.checkpoints import dcp_chunks, open_store, writer
from training_platform.checkpoints.manifest import chunk_digest
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.sharded import restore_latest_sharded, save_sharded
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
    assert len(shard.chunks) > 3 and shard == on_disk.files["__0_0.distcp"]
    # .metadata holds a save id of its own and the directory's path (none here): its own small chunk.
    assert len(files.files[".metadata"].chunks) == 1 and 0 < files.files[".metadata"].size < PIECE


def test_a_sharded_save_restores_and_a_second_save_of_the_same_state_writes_nothing(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    first = save_sharded(store, "r", 1, state(1))
    second = save_sharded(store, "r", 2, state(1) | {"step": 1})
    shard = second.files["__0_0.distcp"]
    assert first.save.bytes_written > 12 * 40_000 and second.save.bytes_written < 2 * PIECE
    assert second.save.bytes_deduplicated >= shard.size - PIECE

    target = {key: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for key, v in state(1).items()}
    manifest, _ = restore_latest_sharded(store, "r", target)
    assert manifest.step == 2
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


def test_a_store_that_fails_a_write_fails_the_save_and_publishes_nothing(tmp_path, monkeypatch):
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
