"""Sizes in a crafted manifest are checked before anything is allocated for them."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import manifest_key
from training_platform.errors import CheckpointError

HUGE = 1 << 40  # a terabyte: MemoryError when allocated


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def craft(store: CheckpointStore, edit) -> None:
    """Rewrite run r's step-1 manifest with `edit`, with a matching sha256, as anyone can."""
    key = manifest_key("r", 1)
    body = json.loads(store.storage.get(key))
    edit(body)
    content = {k: v for k, v in body.items() if k not in ("manifest_sha256", "uri", "tier")}
    body["manifest_sha256"] = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())
    body["manifest_sha256"] = body["manifest_sha256"].hexdigest()
    store.storage.put(key, json.dumps(body).encode())


def test_a_huge_chunk_size_is_refused_before_allocating(store):
    store.save("r", 1, {"w": torch.zeros(8)})
    craft(store, lambda body: body["skeleton"].update(size=HUGE))
    with pytest.raises(CheckpointError, match=f"chunk size {HUGE} is outside 0..{1 << 30}.*crafted"):
        store.restore_latest("r")


def test_a_tensor_larger_than_its_chunks_is_refused_before_allocating(store):
    store.save("r", 1, {"w": torch.zeros(8)})

    def grow(body: dict) -> None:
        body["tensors"][0].update(size=HUGE, shape=[HUGE // 4])

    craft(store, grow)
    with pytest.raises(CheckpointError, match=f"tensor of {HUGE} bytes from offset 0 does not lie within its chunks"):
        store.restore_latest("r")


def test_a_state_whose_non_tensor_part_exceeds_a_chunk_is_refused_when_saved(store, monkeypatch):
    from training_platform.checkpoints import writer

    monkeypatch.setattr(writer, "MAX_CHUNK_BYTES", 4096)
    with pytest.raises(CheckpointError, match="non-tensor part takes .* bytes.*keep large data in tensors"):
        store.save("r", 1, {"notes": "x" * 10_000})
    assert store.list("r") == []
