"""Staged saves: a checkpoint is visible once finished; a reused chunk that vanished while the
save settled is written again from the snapshot, or fails the save once the snapshot is released."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.serialization import flatten_state, tensor_blob
from training_platform.checkpoints.writer import stage_checkpoint, write_checkpoint
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    return open_store(tmp_path / "store")


def weights(seed: int) -> torch.Tensor:
    return torch.randn(3000, generator=torch.Generator().manual_seed(seed))


def save_parts(seed: int) -> dict:
    skeleton, tensors = flatten_state({"w": weights(seed)})
    return {"skeleton": skeleton, "blobs": [tensor_blob(t) for t in tensors], "lease_settle_seconds": 0.0}


def signed(store: CheckpointStore, parts: dict) -> dict:
    return parts | {"signer": store.signer}


def orphaned_chunks(store: CheckpointStore, parts: dict) -> list[str]:
    """Save `parts` as run "old", then drop its manifest: its chunks stay until a GC."""
    manifest, _ = write_checkpoint(store.storage, "old", 1, **signed(store, parts))
    store.storage.delete(manifest_key("old", 1))  # retention keeps a run's newest restorable one
    return [ref.digest for ref in manifest.chunks]


def test_a_staged_save_is_visible_only_once_finished(store):
    staged = stage_checkpoint(store.storage, "r", 1, **signed(store, save_parts(0)))
    assert store.list("r") == []
    staged.finish()
    assert [m.step for m in store.list("r")] == [1]


def test_a_reused_chunk_removed_while_the_save_settles_is_written_again(store):
    parts = save_parts(0)
    digests = orphaned_chunks(store, parts)
    staged = stage_checkpoint(store.storage, "r", 1, **signed(store, parts))
    assert staged.lease and staged.stats.bytes_written == 0  # everything was reused
    for digest in digests:  # a GC that read the leases just before this save's lease appeared
        store.storage.delete(chunk_key(digest))
    staged.finish()
    assert torch.equal(store.restore_latest("r").state["w"], weights(0))


def test_after_the_snapshot_is_released_a_removed_chunk_fails_the_save_and_the_next_writes_it(store):
    parts = save_parts(0)
    digests = orphaned_chunks(store, parts)
    staged = stage_checkpoint(store.storage, "r", 1, **signed(store, parts))
    staged.release_snapshot()
    store.storage.delete(chunk_key(digests[0]))
    with pytest.raises(CheckpointError, match="deleted by a garbage collection.*next save writes the chunk again"):
        staged.finish()
    assert store.list("r") == [] and store.storage.list("leases") == []  # unpublished, its lease dropped
    write_checkpoint(store.storage, "r", 2, **signed(store, parts))
    assert store.restore_latest("r").manifest.step == 2
