"""Two interleavings of GC with a save that the timing rules alone did not cover.

- A GC thread that stalls between its window check and its delete (a busy machine, the GIL)
  removes a reused chunk after the save re-checked it: GC now sets chunks aside, reads leases
  and manifests again, and puts back what they name.
- A GC that listed a chunk as old garbage, which was then deleted by someone else and written
  anew by a save (no lease: it was not reused), deleted the new copy before the save's manifest
  was out: GC now looks at the chunk's age again right before it sets it aside.

Each test holds GC at the named moment with events, so the interleaving happens every time.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from training_platform.checkpoints import writer
from training_platform.checkpoints.layout import chunk_key, trash_key
from training_platform.checkpoints.manifest import chunk_digest
from training_platform.checkpoints.retention import STALE_TRASH_SECONDS, collect_garbage, storage_now
from training_platform.checkpoints.serialization import byte_view, tensor_blob
from training_platform.checkpoints.storage import LocalStorage
from training_platform.checkpoints.store import CheckpointStore

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")

GRACE = 3600.0
WAIT = 60.0
TENSOR = torch.arange(1024, dtype=torch.float32)
KEY = chunk_key(chunk_digest(byte_view(TENSOR)))


class HeldStorage(LocalStorage):
    """A local tier that calls `hook(event, key)` at the moments the tests hold GC."""

    hook = staticmethod(lambda event, key: None)

    def move(self, key: str, target: str) -> None:
        self.hook("remove", key)
        super().move(key, target)

    def delete(self, key: str) -> None:
        self.hook("remove", key)
        super().delete(key)

    def exists(self, key: str) -> bool:
        found = super().exists(key)
        self.hook("exists", key)
        return found

    def list_info(self, prefix: str):
        infos = super().list_info(prefix)
        self.hook(f"listed {prefix}", "")
        return infos

    def put(self, key: str, data, **options) -> None:
        self.hook("put", key)
        super().put(key, data, **options)


def leave_as_old_garbage(storage: LocalStorage) -> None:
    LocalStorage.put(storage, KEY, tensor_blob(TENSOR).data)
    old = storage.stat(KEY).modified - 2 * GRACE
    os.utime(storage.root / KEY, (old, old))


def a_store(tmp_path, monkeypatch) -> tuple[CheckpointStore, HeldStorage]:
    monkeypatch.setattr(writer, "CHUNK_BYTES", 4096)  # one chunk per tensor
    monkeypatch.setattr(writer, "PACK_BELOW_BYTES", 1024)
    storage = HeldStorage(tmp_path / "store")
    return CheckpointStore(storage, lease_settle_seconds=writer.MIN_SETTLE_SECONDS), storage


GC_THREAD = "held-gc"


def on_gc() -> bool:
    return threading.current_thread().name == GC_THREAD


def collect_in_thread(storage: LocalStorage) -> tuple[threading.Thread, list, list[BaseException]]:
    """One GC in a thread the hooks know by its name (from its first instruction on); its report and errors."""
    reports: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            reports.append(collect_garbage(storage, GRACE))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, name=GC_THREAD)
    thread.start()
    return thread, reports, errors


def test_a_gc_that_stalls_past_its_window_puts_back_a_chunk_a_save_has_rechecked(tmp_path, monkeypatch):
    store, storage = a_store(tmp_path, monkeypatch)
    leave_as_old_garbage(storage)
    about_to_remove, rechecked = threading.Event(), threading.Event()

    def hook(event: str, key: str) -> None:
        if event == "remove" and key == KEY and on_gc() and not about_to_remove.is_set():
            about_to_remove.set()
            assert rechecked.wait(WAIT), "the save never re-checked its reused chunk"
        elif event == "exists" and key == KEY and not on_gc():
            rechecked.set()

    storage.hook = hook
    collector, reports, errors = collect_in_thread(storage)
    assert about_to_remove.wait(WAIT), "GC never came to the old chunk"
    # GC read the leases before this save's lease existed, and passed its window check; it stalls
    # until the save, which found the chunk stored and reused it, has re-checked it.
    store.save("run", 1, {"x": TENSOR})
    collector.join(WAIT)
    assert errors == [] and not collector.is_alive()

    restored = store.load(store.list("run")[-1])
    assert torch.equal(restored["x"], TENSOR)
    assert reports[0].put_back_chunks == 1 and reports[0].deleted_chunks == 0
    assert storage.list("trash") == []


def test_a_gc_spares_a_chunk_written_anew_since_it_listed_it_as_old(tmp_path, monkeypatch):
    store, storage = a_store(tmp_path, monkeypatch)
    leave_as_old_garbage(storage)
    listed, release = threading.Event(), threading.Event()
    collector: threading.Thread | None = None

    def hook(event: str, key: str) -> None:
        if event == "listed chunks" and on_gc() and not listed.is_set():
            listed.set()  # GC holds the chunk as an old candidate
            assert release.wait(WAIT), "the save never came to its manifest"
        elif event == "put" and key.startswith("runs/") and not on_gc() and not release.is_set():
            release.set()  # the chunk is stored anew and its manifest is not out: GC runs to its end
            collector.join(WAIT)

    storage.hook = hook
    collector, _, errors = collect_in_thread(storage)
    assert listed.wait(WAIT), "GC never listed the chunks"
    storage.delete(KEY)  # as another GC would, between this one's listing and its delete
    store.save("run", 1, {"x": TENSOR})  # stores the chunk anew: nothing reused, so no lease
    assert errors == [] and not collector.is_alive()

    restored = store.load(store.list("run")[-1])
    assert torch.equal(restored["x"], TENSOR)


def test_what_a_dead_gc_left_aside_is_read_from_there_and_the_next_gc_settles_it(tmp_path, monkeypatch):
    store, storage = a_store(tmp_path, monkeypatch)
    store.save("run", 1, {"x": TENSOR})
    orphan = torch.full((1024,), 7.0)
    orphan_key = chunk_key(chunk_digest(byte_view(orphan)))
    LocalStorage.put(storage, orphan_key, tensor_blob(orphan).data)
    long_ago = storage_now(storage) - 2 * STALE_TRASH_SECONDS
    # A GC set both aside an hour ago and died before its second read of leases and manifests.
    kept_aside = trash_key(KEY.removeprefix("chunks/"), long_ago, "deadgc")
    storage.move(KEY, kept_aside)
    storage.move(orphan_key, trash_key(orphan_key.removeprefix("chunks/"), long_ago, "deadgc"))

    assert torch.equal(store.load(store.list("run")[-1])["x"], TENSOR)  # read from trash/
    report = collect_garbage(storage, GRACE)
    assert report.put_back_chunks == 1
    assert storage.exists(KEY) and not storage.exists(orphan_key) and storage.list("trash") == []
    assert torch.equal(store.load(store.list("run")[-1])["x"], TENSOR)


def test_a_chunk_written_at_the_very_second_gc_reads_its_clock_is_collected_with_no_grace(tmp_path, monkeypatch):
    # S3 keeps modification times to the second: a chunk stored in the second of GC's clock probe is as old as the
    # cutoff of a zero grace. The listing counted it old; taking it must agree (it once called it young, and kept it).
    from training_platform.checkpoints import retention

    storage = LocalStorage(tmp_path)
    data = b"unreferenced"
    storage.put(chunk_key(chunk_digest(data)), data)
    second = float(int(os.stat(tmp_path / chunk_key(chunk_digest(data))).st_mtime))
    os.utime(tmp_path / chunk_key(chunk_digest(data)), (second, second))
    monkeypatch.setattr(retention, "storage_now", lambda storage: second)
    report = collect_garbage(storage, grace_seconds=0)
    assert report.young_chunks == 0 and not storage.exists(chunk_key(chunk_digest(data)))
