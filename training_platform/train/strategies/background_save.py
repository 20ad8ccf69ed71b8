"""A strategy's periodic saves in the background: the loop waits only for what must be copied before it goes on.

FSDP: every rank copies its shard of the state to the CPU (DCP's stager: DTensors stay DTensors) and returns to
training; a thread then writes the copy through DCP and the store (`save_sharded`) on a process group of its own,
so training's collectives never queue behind a save's, nor a save's behind training's. The checkpoint becomes
visible only once every rank's shard is durable: rank 0 writes the manifest after the ranks agree, and a save
that failed on one rank fails on all (save_sharded).

DeepSpeed: its engine writes every rank's files to a local staging directory (the loop's wait), and rank 0's
thread stores them (hash, deduplicate, write, fsync, manifest last).

One save is in flight at a time: a save that comes due while the previous one is still being written waits for
it, and so do the run's last save and a preemption's before the run leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from training_platform.checkpoints import CheckpointManifest


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


class BackgroundSaves:
    """One save at a time, in a thread of this process's own."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tp-strategy-save")
        self._in_flight: _InFlight | None = None

    def submit(self, step: int, save: Callable[[], CheckpointManifest], stall_seconds: float) -> None:
        """SAVE() in the background; STALL_SECONDS: what the loop waited for it (its copy of the state)."""
        assert self._in_flight is None, "collect the save in flight (finished(wait=True)) before the next"
        self._in_flight = _InFlight(step, stall_seconds, self._pool.submit(save))

    def finished(self, wait: bool = False) -> Finished | None:
        """The save in flight once it ended (WAIT: wait for its end); None while it runs, or with none."""
        in_flight = self._in_flight
        if in_flight is None or not (wait or in_flight.future.done()):
            return None
        self._in_flight = None
        error = in_flight.future.exception()
        manifest = None if error is not None else in_flight.future.result()
        return Finished(in_flight.step, in_flight.stall_seconds, manifest, error)


class ShardStaging:
    """Collective to build (every rank, in the same order: it creates the saves' process group)."""

    def __init__(self) -> None:
        # gloo: a shard copied to the CPU travels on the CPU, whatever backend training uses.
        self.group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None
        # On a GPU the copy goes to pinned buffers kept between saves; a CPU tensor is copied to a fresh one.
        self._stager = BlockingAsyncStager(cache_staged_state_dict=torch.cuda.is_available())

    def copy(self, state: dict[str, Any]) -> dict[str, Any]:
        return self._stager.stage(state)

