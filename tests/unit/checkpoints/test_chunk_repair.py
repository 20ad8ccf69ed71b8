"""Damaged chunks are not trusted by dedup: a chunk of the wrong size is written again by the next
save, and a chunk that fails its hash on read is quarantined, so the next save writes it again."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


def state() -> dict:
    return {"w": torch.arange(3000, dtype=torch.float32)}  # 12 KB: three 4 KB chunks with small_chunks


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def test_a_truncated_chunk_is_written_again_by_the_next_save(store, tmp_path):
    first, _ = store.save("r", 1, state())
    ref = first.tensors[0].chunks[1]
    (tmp_path / "store" / chunk_key(ref.digest)).write_bytes(b"")  # zeroed: truncated to nothing

    second, stats = store.save("r", 2, state())

    assert stats.bytes_written >= ref.size  # not deduplicated against the damaged copy
    assert (tmp_path / "store" / chunk_key(ref.digest)).stat().st_size == ref.size
    restored = store.restore_latest("r")
    assert restored.manifest.step == 2 and torch.equal(restored.state["w"], state()["w"])


def test_a_zero_filled_chunk_is_quarantined_on_read_then_written_again(store, tmp_path):
    first, _ = store.save("r", 1, state())
    ref = first.tensors[0].chunks[0]
    path = tmp_path / "store" / chunk_key(ref.digest)
    path.write_bytes(bytes(ref.size))  # zeroed in place: the size still matches

    with pytest.raises(CheckpointError, match=f"{ref.digest}.*quarantined"):
        store.load(first)

    assert not path.exists()
    [quarantined] = store.storage.list("quarantine")
    assert store.storage.get(quarantined) == bytes(ref.size)  # kept for inspection, out of dedup's way
    _, stats = store.save("r", 2, state())
    assert stats.bytes_written >= ref.size
    restored = store.restore_latest("r")
    assert restored.manifest.step == 2 and torch.equal(restored.state["w"], state()["w"])
