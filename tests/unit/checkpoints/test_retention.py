"""Retention rules, pins, and GC that deletes only unreferenced chunks, also during saves."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from training_platform.checkpoints import RetentionPolicy, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.retention import steps_to_keep

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


def state(step: int) -> dict:
    return {"w": torch.full((2000,), float(step)), "frozen": torch.arange(3000, dtype=torch.float32)}


@pytest.fixture
def store(tmp_path, small_chunks):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def test_keep_last_best_and_every(store):
    for step in range(1, 11):
        store.save("r", step, state(step), {"val_loss": abs(step - 4) + 0.5})
    policy = RetentionPolicy(keep_last=2, keep_best=2, best_metric="val_loss", keep_every=5)
    assert sorted(steps_to_keep(store.list("r"), policy, pinned=set())) == [3, 4, 5, 9, 10]
    removed = store.apply_retention("r", policy)
    assert removed == [1, 2, 6, 7, 8] and [m.step for m in store.list("r")] == [3, 4, 5, 9, 10]


def test_best_mode_max_and_invalid_policies():
    with pytest.raises(ValueError, match="best_metric"):
        RetentionPolicy(keep_best=1)
    with pytest.raises(ValueError, match="best_mode"):
        RetentionPolicy(best_mode="median")


def test_pinned_checkpoints_survive_prune_and_gc(store):
    for step in range(1, 6):
        store.save("r", step, state(step))
    store.pin("r", 2, "registered model churn v3")
    assert store.prune("r", keep_last=1) == [1, 3, 4]
    assert [m.step for m in store.list("r")] == [2, 5]
    store.gc(grace_seconds=0)
    assert store.restore_latest("r").manifest.step == 5
    assert torch.equal(store.load(store.list("r")[0])["w"], state(2)["w"])
    store.unpin("r", 2, "registered model churn v3")
    assert store.prune("r", keep_last=1) == [2]


def test_gc_deletes_only_unreferenced_old_chunks(store, tmp_path):
    for step in range(1, 4):
        store.save("r", step, state(step))
    old = store.list("r")[0]
    store.prune("r", keep_last=1)
    young = store.gc(grace_seconds=3600)
    assert young.deleted_chunks == 0 and young.young_chunks > 0
    report = store.gc(grace_seconds=0)
    assert report.deleted_chunks > 0
    survivors = {ref.digest for ref in store.list("r")[-1].chunks}
    assert all((tmp_path / "store" / chunk_key(d)).exists() for d in survivors)
    assert set(report.deleted).isdisjoint(survivors)
    assert any(not (tmp_path / "store" / chunk_key(r.digest)).exists() for r in old.chunks)
    assert store.restore_latest("r").manifest.step == 3


def test_gc_keeps_chunks_listed_in_a_lease(store, tmp_path):
    manifest, _ = store.save("r", 1, state(1))
    store.storage.delete(manifest_key("r", 1))  # retention keeps a run's newest restorable one
    digest = manifest.chunks[0].digest
    store.storage.put("leases/in-progress.json", f'{{"chunks": ["{digest}"]}}'.encode())
    store.gc(grace_seconds=0)
    assert (tmp_path / "store" / chunk_key(digest)).exists()


@pytest.mark.slow
def test_gc_running_during_saves_never_breaks_a_checkpoint(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.5
    stop = threading.Event()
    errors: list[BaseException] = []

    def collect() -> None:
        while not stop.is_set():
            try:
                # The grace must outlast a save's chunk phase (ms here), not the whole save.
                store.gc(grace_seconds=0.6)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for step in range(1, 9):
            store.save("r", step, state(step % 2))  # alternate: every save reuses orphaned chunks
            store.prune("r", keep_last=1)
            restored = store.restore_latest("r")
            assert restored.manifest.step == step and restored.skipped == []
    finally:
        stop.set()
        collector.join()
    assert not errors


def test_stale_leases_are_dropped(store, tmp_path):
    store.storage.put("leases/old.json", b'{"chunks": []}')
    old = time.time() - 3 * 24 * 3600
    os.utime(tmp_path / "store" / "leases" / "old.json", (old, old))
    store.gc(grace_seconds=0)
    assert not store.storage.exists("leases/old.json")


def test_a_dry_run_deletes_nothing_and_says_per_run_what_would_go(store, tmp_path):
    for run in ("a", "b"):
        for step in (1, 2, 3):
            store.save(run, step, state(step + (10 if run == "b" else 0)))
        store.prune(run, keep_last=1)
    chunks = lambda: {info.key for info in store.storage.list_info("chunks")}  # noqa: E731
    before = chunks()
    dry = store.gc(grace_seconds=0, dry_run=True)
    assert dry.dry_run and chunks() == before
    assert set(dry.by_run) == {"a", "b"} and dry.by_run["a"].chunks > 0
    done = store.gc(grace_seconds=0)
    assert (done.deleted_bytes, {r: vars(f) for r, f in done.by_run.items()}) == (
        dry.deleted_bytes,
        {r: vars(f) for r, f in dry.by_run.items()},
    )
    assert store.storage.list("removed") == []  # every removed checkpoint's chunks are gone: records too
