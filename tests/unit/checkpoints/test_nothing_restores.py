"""A run whose checkpoints exist but none restores fails with the reasons and changes nothing;
retention orders by save time and never gives up the newest restorable checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training_platform.checkpoints import CheckpointManifest, CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


def state(step: int) -> dict:
    return {"w": torch.full((2000,), float(step)), "frozen": torch.arange(3000, dtype=torch.float32)}


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def own_chunk(manifest: CheckpointManifest) -> str:
    """A chunk only this checkpoint has: the first piece of its `w`."""
    return chunk_key(manifest.tensors[0].chunks[0].digest)


def flip_a_byte(root: Path, key: str) -> None:
    data = bytearray((root / key).read_bytes())
    data[7] ^= 0xFF
    (root / key).write_bytes(bytes(data))


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_corrupted_checkpoints_fail_the_restore_with_every_reason_and_nothing_is_lost(store, tmp_path):
    root = tmp_path / "store"
    for step in (100, 200):
        flip_a_byte(root, own_chunk(store.save("r", step, state(step))[0]))
    before = files_under(root)

    with pytest.raises(CheckpointError) as failure:
        store.restore_latest("r")

    message = str(failure.value)
    assert "run r has 2 checkpoints" in message and "none restores" in message
    assert "step 200: chunk" in message and "step 100: chunk" in message and "blake3 hash" in message
    assert "does not start over" in message
    after = files_under(root)
    assert {k for k in after if k.startswith("runs/")} == {k for k in before if k.startswith("runs/")}
    # Every byte is still in the store: the damaged chunks moved to quarantine/, nothing was deleted.
    assert sorted(after.values()) == sorted(before.values())


def test_an_unreadable_manifest_alone_also_fails_the_restore(store, tmp_path):
    store.save("r", 1, state(1))
    (tmp_path / "store" / manifest_key("r", 1)).write_text('{"run_id": "r", "st')
    with pytest.raises(CheckpointError, match="step 1: manifest .* is unreadable"):
        store.restore_latest("r")


def test_a_run_without_checkpoints_starts_fresh(store):
    assert store.restore_latest("never-saved") is None


def test_retention_keeps_the_newest_save_not_the_highest_step(store, tmp_path):
    """The issue's case: broken step-100/200 checkpoints, then a save at step 10."""
    root = tmp_path / "store"
    for step in (100, 200):
        (root / own_chunk(store.save("r", step, state(step))[0])).unlink()
    store.save("r", 10, state(10))

    assert store.prune("r", keep_last=2) == [100]

    assert [m.step for m in store.list("r")] == [10, 200]
    restored = store.restore_latest("r")
    assert restored.manifest.step == 10 and torch.equal(restored.state["w"], state(10)["w"])


def test_retention_never_keeps_only_unrestorable_checkpoints(store, tmp_path):
    root = tmp_path / "store"
    store.save("r", 1, state(1))
    for step in (2, 3):
        (root / own_chunk(store.save("r", step, state(step))[0])).write_bytes(b"")  # truncated

    assert store.prune("r", keep_last=1) == [2]

    assert [m.step for m in store.list("r")] == [1, 3]
    assert store.restore_latest("r").manifest.step == 1


def test_retention_removes_nothing_when_no_checkpoint_restores(store, tmp_path):
    root = tmp_path / "store"
    for step in (1, 2, 3):
        (root / own_chunk(store.save("r", step, state(step))[0])).unlink()
    assert store.prune("r", keep_last=1) == []
    assert [m.step for m in store.list("r")] == [1, 2, 3]
