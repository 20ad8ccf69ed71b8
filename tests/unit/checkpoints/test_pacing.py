"""A background save's pace: spread over half the time between saves, hurried by whoever waits for it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from training_platform.checkpoints import AsyncCheckpointer, open_store, pacing
from training_platform.checkpoints.pacing import MAX_PACE_SECONDS, PACE_FRACTION, Pacer, SaveCadence
from training_platform.checkpoints.storage import LocalStorage
from training_platform.checkpoints.writer import Blob, write_chunks


def test_the_first_save_is_unpaced_and_later_ones_take_half_the_gap_between_saves():
    cadence = SaveCadence()
    assert cadence.started(100.0) == 0.0
    assert cadence.started(110.0) == pytest.approx(PACE_FRACTION * 10)
    assert cadence.started(130.0) == pytest.approx(PACE_FRACTION * 15)  # median of 10 and 20
    assert cadence.started(10_000.0) == pytest.approx(PACE_FRACTION * 20)  # one long gap does not set the pace
    rare = SaveCadence()
    rare.started(0.0)
    assert rare.started(3600.0) == MAX_PACE_SECONDS  # a checkpoint is not held back long from being published


def test_a_pacer_spreads_its_bytes_over_its_seconds_and_counts_only_work_as_busy():
    pacer = Pacer(seconds=2.0)
    pacer.plan(4_000)  # four turns of 1000 bytes: 0.5 s each
    started = time.monotonic()
    turns = []

    def take() -> None:
        with pacer.turn(1_000):
            turns.append(time.monotonic() - started)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(turns) == 4 and max(turns) >= 1.5  # the fourth turn starts 3 x 0.5 s after the first
    assert pacer.busy_seconds < 1.0  # the turns did nothing: the waits are not work
    # ... the save only kept its pace from the first turn to the last (threads waited, none worked).
    assert max(turns) - 0.2 <= pacer.idle_seconds <= time.monotonic() - started


def test_a_pacer_idles_only_while_nothing_works():
    pacer = Pacer(seconds=1.0)
    pacer.plan(2_000)  # two turns of 1000 bytes, 0.5 s apart
    def second() -> None:
        with pacer.turn(1_000):
            pass

    with pacer.turn(1_000):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.8)  # working: the second turn waits meanwhile, and that is not idle
    waiter.join(timeout=60)
    assert pacer.idle_seconds < 0.3 and pacer.busy_seconds >= 0.8


def test_hurry_releases_a_pacer_at_once():
    pacer = Pacer(seconds=3600.0)
    pacer.plan(2)

    def take() -> None:
        with pacer.turn(1):
            pass

    take()
    second = threading.Thread(target=take)  # its turn is due in half an hour
    second.start()
    pacer.hurry()
    second.join(timeout=60)
    assert not second.is_alive()


def test_write_chunks_reports_the_time_spent_waiting_for_its_pace(tmp_path):
    blobs = [Blob(data=memoryview(bytearray([i]) * (512 << 10)), dtype="uint8", shape=[512 << 10]) for i in range(4)]
    written = write_chunks(LocalStorage(tmp_path), blobs=blobs, pacer=Pacer(4.0))
    # Turns at 0, 1, 2 and 3 s: at least 3 s, of which writing 2 MB is a small part.
    assert written.stats.paced_idle_seconds >= 1.5
    assert written.stats.bytes_written == 4 * (512 << 10)


def state(step: int) -> dict:
    return {f"layer{i}": torch.full((1 << 18,), float(10 * step + i)) for i in range(4)}  # 1 MiB each: a chunk each


def test_a_paced_save_waits_its_turn_until_the_trainer_waits_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pacing, "PACE_FRACTION", 1e9)  # any gap between saves: the longest pace
    monkeypatch.setattr(pacing, "MAX_PACE_SECONDS", 3600.0)
    store = open_store(tmp_path / "store")
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))  # the first save: unpaced
        assert checkpointer.wait().ok
        checkpointer.save_async("r", 2, state(2))  # spread over an hour: a chunk every 15 minutes
        looked_until = time.monotonic() + 3.0
        while time.monotonic() < looked_until:
            assert checkpointer.in_flight
            time.sleep(0.1)
        assert [m.step for m in store.list("r")] == [1]
        result = checkpointer.wait(timeout=120)  # hurries it
        assert result is not None and result.step == 2 and result.ok, result
        # Its work, not its pace: the seconds it spent waiting for its turns are not counted.
        assert result.manifest.save.background_seconds < result.background_seconds - 1.0
    assert torch.equal(store.restore_latest("r").state["layer3"], state(2)["layer3"])


DYING_TRAINER = """
import os, signal, sys
import torch
from training_platform.checkpoints import AsyncCheckpointer, open_store, pacing

pacing.PACE_FRACTION, pacing.MAX_PACE_SECONDS = 1e9, 3600.0
store = open_store(sys.argv[1])
checkpointer = AsyncCheckpointer(store)
checkpointer.save_async("r", 1, {f"layer{i}": torch.full((1 << 18,), 1.0 + i) for i in range(4)})
assert checkpointer.wait().ok
checkpointer.save_async("r", 2, {f"layer{i}": torch.full((1 << 18,), 10.0 + i) for i in range(4)})  # an hour's pace
# Its first turn is being written: into a pack, at a temporary name until sealed. The next turn: in 15 minutes.
while not any(path.name.endswith(".tmp") for path in store.storage.root.rglob(".*")):
    pass
print(checkpointer.writer_pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_whose_trainer_died_mid_pace_does_not_wait_out_its_pace(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", DYING_TRAINER, str(tmp_path / "store")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    writer = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while psutil.pid_exists(writer) and psutil.Process(writer).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the writer outlived its trainer by a minute, waiting for its pace"
        time.sleep(0.1)
    assert [m.step for m in open_store(tmp_path / "store").list("r")] == [1]  # the paced save was abandoned
