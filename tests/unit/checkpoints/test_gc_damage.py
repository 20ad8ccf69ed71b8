"""GC on a damaged store: one unreadable manifest does not stop the collection of every other
run, and ages come from the storage's clock, not this machine's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.serialization import tensor_blob
from training_platform.checkpoints.storage import Buffer, LocalStorage
from training_platform.checkpoints.writer import write_chunks

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


def state(seed: int) -> dict:
    return {"w": torch.full((2000,), float(seed)), "frozen": torch.arange(3000, dtype=torch.float32)}


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def test_an_unreadable_manifest_keeps_its_chunks_and_gc_goes_on_for_the_others(store, tmp_path):
    root = tmp_path / "store"
    damaged, _ = store.save("a", 1, state(1))
    old, _ = store.save("b", 1, state(2))
    store.save("b", 2, state(3))
    store.prune("b", keep_last=1)  # b's step-1 chunks are garbage now
    path = root / manifest_key("a", 1)
    path.write_text(path.read_text()[:-60])  # torn at the end: no longer JSON, its chunk names still there

    report = store.gc(grace_seconds=0)

    assert all((root / chunk_key(ref.digest)).exists() for ref in damaged.chunks)
    only_old = {ref.digest for ref in old.chunks} - {ref.digest for m in store.list("b") for ref in m.chunks}
    assert only_old and all(not (root / chunk_key(digest)).exists() for digest in only_old)
    assert set(report.deleted) == only_old
    [(uri, reason)] = report.skipped.items()
    assert uri.endswith(manifest_key("a", 1)) and "unreadable" in reason


class SlowClockStorage(LocalStorage):
    """A filesystem whose clock is two hours behind this machine's (a file server, say): what
    GC sees when the local clock runs two hours fast."""

    def put(self, key: str, data: Buffer, **options) -> None:
        super().put(key, data, **options)
        behind = time.time() - 7200
        os.utime(self._path(key), (behind, behind))


def test_gc_measures_ages_by_the_storage_clock(tmp_path, small_chunks):
    store = CheckpointStore(SlowClockStorage(tmp_path / "store"))
    root = Path(store.storage.uri)
    orphan = write_chunks(store.storage, blobs=[tensor_blob(torch.full((10,), 7.0))]).tensors[0].chunks[0]
    long_ago = time.time() - 7200 - 5000  # by the storage's clock, 5000 s ago
    os.utime(root / chunk_key(orphan.digest), (long_ago, long_ago))
    # A save in flight: its chunks are written, its lease or manifest is not there yet.
    in_flight = write_chunks(store.storage, blobs=[tensor_blob(torch.arange(3000.0))]).tensors[0].chunks

    report = store.gc(grace_seconds=3600)

    assert all((root / chunk_key(ref.digest)).exists() for ref in in_flight)
    assert report.young_chunks == len(in_flight)
    assert report.deleted == [orphan.digest] and not (root / chunk_key(orphan.digest)).exists()
    assert store.storage.list("clock") == []  # the clock probe is gone again
