"""A strategy's saves in the background: one in flight, their outcome told to the session in the loop's thread."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from training_platform.checkpoints import CheckpointManifest, pacing
from training_platform.errors import CheckpointError
from training_platform.train.strategies.background_save import BackgroundSaves, ShardStaging
from training_platform.train.strategies.base import with_buffers_copied
from training_platform.train.strategies.ddp import DDPStrategy


class Hooks:
    """What a session's hooks are told (the session's own bookkeeping is tested with real runs)."""

    def __init__(self) -> None:
        self.saved: list[tuple[int, float]] = []
        self.failed: list[tuple[int, str]] = []

    def checkpoint_saved(self, manifest: CheckpointManifest, seconds: float = 0.0) -> None:
        self.saved.append((manifest.step, seconds))

    def checkpoint_failed(self, step: int, error: str) -> None:
        self.failed.append((step, error))


def strategy() -> tuple[DDPStrategy, Hooks]:
    hooks = Hooks()
    result = DDPStrategy(SimpleNamespace(hooks=hooks))
    result.background = BackgroundSaves()
    return result, hooks


def test_a_save_is_told_once_it_ended_with_the_loops_stall_and_polls_before_do_not_wait():
    saving, hooks = strategy()
    release = threading.Event()

    def save(pacer) -> CheckpointManifest:
        release.wait(30)
        return CheckpointManifest(run_id="r", step=10, kind="state")

    saving.background.submit(10, save, stall_seconds=0.02)
    saving.poll()
    assert hooks.saved == []  # still being written: the loop goes on
    release.set()
    saving.flush()
    assert hooks.saved == [(10, 0.02)]
    saving.flush()  # nothing in flight: nothing more to tell
    assert hooks.saved == [(10, 0.02)]


@pytest.mark.parametrize("error", [CheckpointError("store refused"), OSError(28, "No space left on device")])
def test_a_failed_save_is_reported_and_training_goes_on(error):
    saving, hooks = strategy()

    def save(pacer) -> CheckpointManifest:
        raise error

    saving.background.submit(20, save, stall_seconds=0.01)
    saving.flush()
    assert hooks.saved == [] and hooks.failed == [(20, str(error))]


def test_a_bug_in_a_background_save_fails_the_run_in_the_loops_thread():
    saving, _ = strategy()

    def save(pacer) -> CheckpointManifest:
        raise KeyError("model")

    saving.background.submit(30, save, stall_seconds=0.01)
    with pytest.raises(KeyError):
        saving.flush()


def test_one_save_in_flight_at_a_time():
    saving, _ = strategy()
    release = threading.Event()
    saving.background.submit(10, lambda pacer: release.wait(30), stall_seconds=0.0)
    with pytest.raises(AssertionError, match="before the next"):
        saving.background.submit(20, lambda pacer: None, stall_seconds=0.0)
    release.set()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_save_runs_at_idle_priority_until_the_loop_waits_for_it():
    saving, hooks = strategy()
    seen, started = [], threading.Event()

    def save(pacer) -> CheckpointManifest:
        seen.append(os.sched_getscheduler(0))
        started.set()
        deadline = time.monotonic() + 30
        while os.sched_getscheduler(0) == os.SCHED_IDLE and time.monotonic() < deadline:
            time.sleep(0.01)  # until the loop's wait raises it
        seen.append(os.sched_getscheduler(0))
        return CheckpointManifest(run_id="r", step=40, kind="state")

    saving.background.submit(40, save, stall_seconds=0.0)
    assert started.wait(30)
    saving.flush()
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER] and hooks.saved == [(40, 0.0)]


def test_the_loops_wait_hurries_a_paced_save(monkeypatch):
    monkeypatch.setattr(pacing, "PACE_FRACTION", 1e9)  # any gap between saves: the longest pace
    monkeypatch.setattr(pacing, "MAX_PACE_SECONDS", 3600.0)
    saving, hooks = strategy()
    saving.background.submit(10, lambda pacer: CheckpointManifest(run_id="r", step=10, kind="state"), 0.0)
    saving.flush()
    paces = []

    def save(pacer) -> CheckpointManifest:
        paces.append(pacer.seconds)
        pacer.plan(2)
        for _ in range(2):  # the second byte's turn is half an hour away
            with pacer.turn(1):
                pass
        return CheckpointManifest(run_id="r", step=20, kind="state")

    saving.background.submit(20, save, stall_seconds=0.0)
    saving.flush()
    assert paces == [3600.0] and [step for step, _ in hooks.saved] == [10, 20]


def test_a_shards_copy_runs_beside_the_loop_and_is_whole_once_the_loop_is_ready():
    staging = ShardStaging()  # no process group here: one process
    state = {"w": torch.arange(1 << 20, dtype=torch.float32), "step": 7}
    copy = staging.copy(state)
    staging.ready()  # the loop's optimizer step comes next
    assert copy.done()
    state["w"].add_(1.0)  # the step changes the state
    staged, _ = staging.copied(copy)
    assert torch.equal(staged["w"], torch.arange(1 << 20, dtype=torch.float32)) and staged["step"] == 7
    staging.ready()  # nothing in flight: nothing to wait for


def test_a_failed_copy_fails_its_save_not_the_loop():
    staging = ShardStaging()
    copy = staging.copy({"w": torch.empty(3, device="meta")})  # no data to copy
    staging.ready()  # does not raise: the save reports it
    with pytest.raises(NotImplementedError, match="meta"):
        staging.copied(copy)


def test_a_save_beside_the_next_step_copies_the_buffers_forward_changes_at_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    state = with_buffers_copied(model, model.state_dict())
    model(torch.randn(8, 4))  # a training forward updates the running statistics
    assert not torch.equal(state["1.running_mean"], model[1].running_mean)  # the save keeps those it was given
    assert state["0.weight"].data_ptr() == model[0].weight.data_ptr()  # parameters are copied beside the step
