"""Sharded (DCP) restores in one process: a run whose checkpoints all fail does not start over."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key
from training_platform.checkpoints.sharded import restore_latest_sharded, save_sharded
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def shards(step: int) -> dict:
    return {"w": torch.full((64,), float(step)), "step": step}


def test_shards_restore_in_one_process(store):
    save_sharded(store, "r", 5, shards(5))
    target = {"w": torch.zeros(64), "step": -1}
    manifest, skipped = restore_latest_sharded(store, "r", target)
    assert manifest.step == 5 and skipped == [] and torch.equal(target["w"], shards(5)["w"]) and target["step"] == 5


def test_when_no_sharded_checkpoint_restores_every_reason_is_raised(store, tmp_path):
    for step in (1, 2):
        manifest = save_sharded(store, "r", step, shards(step))
        for ref in manifest.files.values():  # every shard file: each step has its own bytes
            for chunk in ref.chunks:
                (tmp_path / "store" / chunk_key(chunk.digest)).write_bytes(b"")
    store.save("r", 3, {"model": {"w": torch.zeros(64)}})  # the run was trained with DDP once

    with pytest.raises(CheckpointError) as failure:
        restore_latest_sharded(store, "r", {"w": torch.zeros(64), "step": -1})

    message = str(failure.value)
    assert "run r has 3 checkpoints" in message and "does not start over" in message
    assert "step 3: written by another strategy (state)" in message
    assert "step 2: chunk" in message and "step 1: chunk" in message
