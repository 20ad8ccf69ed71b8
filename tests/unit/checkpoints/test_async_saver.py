"""AsyncCheckpointer: snapshot-only stalls, saves published in order, failures reported not raised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from training_platform.checkpoints import AsyncCheckpointer, RetentionPolicy, open_store


def state(step: int) -> dict:
    return {"w": torch.full((256, 1024), float(step)), "frozen": torch.ones(1_200_000), "step": step}


@pytest.fixture
def store(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.5
    return store


def test_saves_in_the_background_and_restores_bitwise(store):
    with AsyncCheckpointer(store) as checkpointer:
        for step in (1, 2):
            checkpointer.save_async("r", step, state(step), {"loss": 1.0 / step})
        result = checkpointer.wait()
        assert result.ok and result.step == 2 and checkpointer.last_error is None
        assert result.manifest.save.stall_seconds == pytest.approx(result.stall_seconds)
        assert result.manifest.save.bytes_deduplicated > 0  # `frozen` was not written twice
    restored = store.restore_latest("r")
    assert restored.manifest.step == 2 and torch.equal(restored.state["w"], state(2)["w"])


def test_the_snapshot_is_taken_at_call_time(store):
    live = state(1)
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, live)
        live["w"].fill_(99.0)  # the training loop goes on mutating its tensors
        assert checkpointer.wait().ok
    assert torch.equal(store.restore_latest("r").state["w"], state(1)["w"])


def test_skip_policy_skips_while_a_save_is_in_flight(store):
    with AsyncCheckpointer(store, policy="skip") as checkpointer:
        checkpointer.save_async("r", 1, state(1))
        checkpointer.wait()
        checkpointer.save_async("r", 2, state(1))  # reuses chunks: settles for 0.5 s in the writer
        checkpointer.save_async("r", 3, state(3))
        skipped = checkpointer.results[-1]
        assert skipped.skipped and skipped.step == 3
        assert checkpointer.wait().step == 2
    assert [m.step for m in store.list("r")] == [1, 2]


def test_a_save_that_settles_does_not_hold_up_the_next_snapshot(store):
    store.lease_settle_seconds = 1.0
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))
        checkpointer.wait()
        checkpointer.save_async("r", 2, state(1))  # the same bytes again (a reproduction): settles for 1 s
        checkpointer.save_async("r", 3, state(3))  # waits only until step 2's chunks are written
        assert [r.step for r in checkpointer.results] == [1] and checkpointer.in_flight
        checkpointer.wait()
        assert [(r.step, r.ok) for r in checkpointer.results] == [(1, True), (2, True), (3, True)]
    assert [m.step for m in store.list("r")] == [1, 2, 3]


def test_a_waited_save_returns_its_published_checkpoint_after_those_in_flight(store):
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))
        result = checkpointer.save("r", 2, state(1))
        assert result.ok and result.step == 2 and not checkpointer.in_flight
        assert [r.step for r in checkpointer.results] == [1, 2]
    assert store.restore_latest("r").manifest.step == 2


def test_a_failed_background_save_is_reported_and_the_next_one_succeeds(store, tmp_path):
    blocker = tmp_path / "store" / "chunks"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory")
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))  # does not raise
        result = checkpointer.wait()
        assert not result.ok and "chunks" in result.error and checkpointer.last_error
        blocker.unlink()
        checkpointer.save_async("r", 2, state(2))
        assert checkpointer.wait().ok and checkpointer.last_error is None
    assert [m.step for m in store.list("r")] == [2]


def test_a_killed_writer_is_reported_and_replaced(store):
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))
        assert checkpointer.wait().ok
        checkpointer.save_async("r", 2, state(1))  # in its settle sleep for 0.5 s
        time.sleep(0.1)
        os.kill(checkpointer.writer_pid, signal.SIGKILL)
        result = checkpointer.wait()
        assert not result.ok and "died" in result.error
        checkpointer.save_async("r", 3, state(3))
        assert checkpointer.wait().ok
    assert [m.step for m in store.list("r")] == [1, 3]


def test_invalid_policy_is_refused(store):
    with pytest.raises(ValueError, match="policy"):
        AsyncCheckpointer(store, policy="maybe")


def test_caller_bugs_raise_at_once_and_nothing_is_in_flight(store):
    with AsyncCheckpointer(store) as checkpointer:
        with pytest.raises(ValueError, match="invalid storage key"):
            checkpointer.save_async("../escape", 1, state(1))
        with pytest.raises(TypeError, match="cannot checkpoint"):
            checkpointer.save_async("r", 1, {"x": object()})
        assert not checkpointer.in_flight and checkpointer.wait() is None


def test_the_writer_applies_retention_after_publishing(store):
    store.pin("r", 1, "release candidate")
    with AsyncCheckpointer(store) as checkpointer:
        for step in (1, 2, 3, 4):
            checkpointer.save_async("r", step, state(step), retention=RetentionPolicy(keep_last=2))
            checkpointer.wait()
        pruned = [result.pruned for result in checkpointer.results]
    assert pruned == [[], [], [], [2]]  # the newest two stay, and step 1 because it is pinned
    assert [m.step for m in store.list("r")] == [1, 3, 4]


def test_the_writer_applies_keep_best_and_keep_every(store):
    policy = RetentionPolicy(keep_last=1, keep_best=1, best_metric="val_loss", keep_every=4)
    with AsyncCheckpointer(store) as checkpointer:
        for step in range(1, 7):
            checkpointer.save_async("r", step, state(step), {"val_loss": abs(step - 2)}, retention=policy)
            assert checkpointer.wait().prune_error is None
    assert [m.step for m in store.list("r")] == [2, 4, 6]  # best, every 4th, last


def test_a_started_writer_is_ready_for_the_first_save(store):
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.start_writer()
        pid = checkpointer.writer_pid
        assert pid is not None  # running before any save
        checkpointer.save_async("r", 1, state(1))
        assert checkpointer.wait().ok and checkpointer.writer_pid == pid  # the same process saved


def test_closing_a_writer_that_never_saved_does_not_wait_for_it(store):
    checkpointer = AsyncCheckpointer(store)
    checkpointer.start_writer()
    process = checkpointer._process
    checkpointer.close()  # at once: the writer may still be importing
    assert process.poll() is not None and checkpointer.writer_pid is None


DYING_TRAINER = """
import os, signal, sys, time
import torch
from training_platform.checkpoints import AsyncCheckpointer, open_store

store = open_store(sys.argv[1])
store.lease_settle_seconds = float(sys.argv[2])
checkpointer = AsyncCheckpointer(store)
state = {"w": torch.ones(300_000)}
checkpointer.save_async("r", 1, state)
assert checkpointer.wait().ok
checkpointer.save_async("r", 2, state)  # reuses every chunk: leased, settles, then the manifest
while not store.storage.list("leases"):
    time.sleep(0.01)
print(checkpointer.writer_pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would, with step 2 settling
"""


def test_a_trainer_killed_with_a_save_in_flight_takes_the_unpublished_save_with_it(store, tmp_path):
    settle = 5.0  # the kill must land inside it: the trainer kills itself as soon as the lease is out
    done = subprocess.run(
        [sys.executable, "-c", DYING_TRAINER, str(tmp_path / "store"), str(settle)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    writer = int(done.stdout.split()[-1])

    def writer_gone() -> bool:
        try:
            return psutil.Process(writer).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 60
    while not writer_gone():
        assert time.monotonic() < deadline, "the writer outlived its trainer by a minute"
        time.sleep(0.1)
    assert [m.step for m in store.list("r")] == [1]  # step 2 was abandoned, step 1 is untouched
    assert store.storage.list("leases") == []  # and its lease does not hold chunks from GC for a day


def test_an_overlapped_snapshot_is_copied_beside_the_caller_and_whole_once_ready(store):
    live = state(1)
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, live, overlap=True)
        assert checkpointer.in_flight  # its copy, at least, is not done with
        checkpointer.ready()  # the loop's optimizer step comes next
        live["w"].fill_(99.0)
        result = checkpointer.wait()
        assert result.ok and result.step == 1 and result.stall_seconds > 0
    assert torch.equal(store.restore_latest("r").state["w"], state(1)["w"])


def test_an_overlapped_snapshot_not_yet_handed_over_is_saved_by_wait_and_close(store):
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1), overlap=True)
        assert checkpointer.wait().ok
        checkpointer.save_async("r", 2, state(2), overlap=True)  # the next save hands the one before over first
    assert [m.step for m in store.list("r")] == [1, 2]


def test_an_overlapped_copy_that_fails_is_reported_not_raised(store):
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, {"w": torch.empty(3, device="meta")}, overlap=True)  # no data to copy
        checkpointer.ready()
        assert "snapshot failed" in checkpointer.last_error
        checkpointer.save_async("r", 2, state(2), overlap=True)
        assert checkpointer.wait().ok
    assert [m.step for m in store.list("r")] == [2]
