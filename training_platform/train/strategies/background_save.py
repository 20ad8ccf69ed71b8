"""Sharded saves in the background: a periodic FSDP checkpoint costs the loop a copy of each rank's shard.

Every rank copies its shard of the state to the CPU (DCP's stager: DTensors stay DTensors) and returns to
training. A thread of its own then writes the copy through DCP and the store (`save_sharded`) on a process group
of its own, so training's collectives never queue behind a save's, nor a save's behind training's. The checkpoint
becomes visible only once every rank's shard is durable: rank 0 writes the manifest after the ranks agree, and a
save that failed on one rank fails on all (save_sharded). One save is in flight at a time: a save that comes due
while the previous one is still being written waits for it, as does the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from training_platform.checkpoints import CheckpointManifest

Save = Callable[[dict[str, Any], Any, float], CheckpointManifest]


@dataclass
class Finished:
    """A background save that ended: its manifest, or the error every rank agreed on."""

    step: int
    stall_seconds: float
    manifest: CheckpointManifest | None
    error: BaseException | None


@dataclass
class _InFlight:
    step: int
    stall_seconds: float
    future: Future


class BackgroundShardedSaves:
    """Collective to build (every rank, in the same order: it creates the saves' process group)."""

    def __init__(self) -> None:
        # gloo: a shard copied to the CPU travels on the CPU, whatever backend training uses.
        self._group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None
        # On a GPU the copy goes to pinned buffers kept between saves; a CPU tensor is copied to a fresh one.
        self._stager = BlockingAsyncStager(cache_staged_state_dict=torch.cuda.is_available())
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tp-sharded-save")
        self._in_flight: _InFlight | None = None

    def submit(self, step: int, state: dict[str, Any], save: Save, started: float) -> None:
        """Copy STATE, then SAVE(copy, process_group, stall_seconds) in the background; STARTED: when the loop
        began to wait for this save."""
        assert self._in_flight is None, "collect the save in flight (finished(wait=True)) before the next"
        staged = self._stager.stage(state)
        stall = time.monotonic() - started
        self._in_flight = _InFlight(step, stall, self._pool.submit(save, staged, self._group, stall))

    def finished(self, wait: bool = False) -> Finished | None:
        """The save in flight once it ended (WAIT: wait for its end); None while it runs, or with none."""
        in_flight = self._in_flight
        if in_flight is None or not (wait or in_flight.future.done()):
            return None
        self._in_flight = None
        error = in_flight.future.exception()
        manifest = None if error is not None else in_flight.future.result()
        return Finished(in_flight.step, in_flight.stall_seconds, manifest, error)
