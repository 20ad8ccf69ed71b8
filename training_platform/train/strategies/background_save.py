"""A strategy's periodic saves in the background: the loop waits only for what must be copied before it goes on.

FSDP: every rank copies its shard of the state to the CPU (DCP's stager: DTensors stay DTensors) in a thread while
the loop goes on with its next forward and backward, which only read the state; the loop waits for the copy only
before its optimizer changes the state (`ShardStaging.ready`). A thread then writes the copy through DCP and the
store (`save_sharded`) on a process group of its own,
so training's collectives never queue behind a save's, nor a save's behind training's. The checkpoint becomes
visible only once every rank's shard is durable: rank 0 writes the manifest after the ranks agree, and a save
that failed on one rank fails on all (save_sharded).

DeepSpeed: its engine writes every rank's files to a local staging directory (the loop's wait), and rank 0's
thread stores them (hash, deduplicate, write, fsync, manifest last).

One save is in flight at a time: a save that comes due while the previous one is still being written waits for
it, and so do the run's last save and a preemption's before the run leaves. A save's chunks are spread over half
the time between saves (checkpoints/pacing.py) until the loop waits for it; the rest is then written at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from training_platform.checkpoints import CheckpointManifest
from training_platform.checkpoints.pacing import Pacer, SaveCadence


@dataclass
class Finished:
    """A background save that ended: its manifest, or its error."""

    step: int
    stall_seconds: float
    manifest: CheckpointManifest | None
    error: BaseException | None


@dataclass
class _InFlight:
    step: int
    stall_seconds: float
    future: Future
    pacer: Pacer


class BackgroundSaves:
    """One save at a time, in a thread of this process's own."""

    def __init__(self) -> None:
        # At idle CPU priority: FSDP on 2 ranks, 0.2 GB, steps during a save 1.81-1.94x -> 1.48-1.50x as long as
        # without (benchmarks/checkpoint.py --sharded-only).
        # Once the loop waits for a save, nothing may starve it (a preemption's grace period runs): the save's
        # threads are raised to normal priority then, and the next save starts idle again.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tp-strategy-save")
        self._in_flight: _InFlight | None = None
        self._priority = threading.Lock()
        self._waited_for = False
        self._cadence = SaveCadence()

    def submit(self, step: int, save: Callable[[Pacer], CheckpointManifest], stall_seconds: float) -> None:
        """SAVE(pacer) in the background, its chunks at the pacer's pace; STALL_SECONDS: what the loop waited
        for it (its copy of the state)."""
        assert self._in_flight is None, "collect the save in flight (finished(wait=True)) before the next"
        pacer = Pacer(self._cadence.started(time.monotonic()))

        def idle_save() -> CheckpointManifest:
            with self._priority:
                if not self._waited_for:  # else the loop waits for it already
                    _idle_priority()
            return save(pacer)

        self._waited_for = False
        self._in_flight = _InFlight(step, stall_seconds, self._pool.submit(idle_save), pacer)

    @property
    def in_flight(self) -> bool:
        """A save is being written now."""
        return self._in_flight is not None and not self._in_flight.future.done()

    def finished(self, wait: bool = False) -> Finished | None:
        """The save in flight once it ended (WAIT: wait for its end); None while it runs, or with none."""
        in_flight = self._in_flight
        if in_flight is None or not (wait or in_flight.future.done()):
            return None
        self._in_flight = None
        if not in_flight.future.done():
            in_flight.pacer.hurry()
            with self._priority:
                self._waited_for = True
                _normal_priority()
        error = in_flight.future.exception()
        manifest = None if error is not None else in_flight.future.result()
        return Finished(in_flight.step, in_flight.stall_seconds, manifest, error)


def _idle_priority() -> None:
    """This thread, and the threads it starts (the store's hashing and writing), run on CPU time the loop leaves
    unused (Linux: SCHED_IDLE); when the loop waits for the save, that is all of it."""
    if hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _normal_priority() -> None:
    """Every thread of this process at idle priority (the save's, and the threads it started) back to normal."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    with contextlib.suppress(OSError):
        for tid in map(int, os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError):  # a thread that just ended
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


class ShardStaging:
    """Collective to build (every rank, in the same order: it creates the saves' process group)."""

    def __init__(self) -> None:
        # gloo: a shard copied to the CPU travels on the CPU, whatever backend training uses.
        self.group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None
        # The copy goes to CPU buffers kept between saves (pinned on a GPU); the save that read them has ended
        # before the next copy (one save in flight). On a GPU it is queued on the default stream, after the
        # kernels that wrote the state and before the next step's.
        cuda = torch.cuda.is_available()
        self._stager = DefaultStager(StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda
        ))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tp-shard-copy")
        self._copy: Future | None = None
        self._waiting_since: float | None = None

    def copy(self, state: dict[str, Any]) -> Future:
        """Start copying the state to the CPU (read it with `copied`). The loop must call `ready()` before it
        changes the state (its optimizer step); forward and backward only read it."""
        self._waiting_since = None
        self._copy = self._pool.submit(self._stage, state)
        return self._copy

    def _stage(self, state: dict[str, Any]) -> tuple[dict[str, Any], float]:
        return self._stager.stage(state), time.monotonic()

    def ready(self) -> None:
        """Wait for the copy in flight, if any (the loop is about to change the state). A copy that failed fails
        its save, which reports it; the loop goes on."""
        if self._copy is not None and not self._copy.done():
            self._waiting_since = time.monotonic()
            concurrent.futures.wait([self._copy])
        self._copy = None

    def copied(self, copy: Future) -> tuple[dict[str, Any], float]:
        """The copied state (raises the copy's error), and how long the loop waited for it in `ready()`."""
        state, finished_at = copy.result()
        waiting_since = self._waiting_since
        return state, max(0.0, finished_at - waiting_since) if waiting_since is not None else 0.0
