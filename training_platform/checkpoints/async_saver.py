"""AsyncCheckpointer: the training loop blocks only to copy the state into a staging buffer.

The staging buffer is an anonymous shared-memory file (memfd), allocated once and pre-faulted,
so a snapshot is one memcpy per tensor at memory bandwidth. A separate writer process (see
writer_process.py; a process, not a thread, so hashing and writing never hold the trainer's
GIL) reads the buffer and writes the checkpoint. A new save never touches the buffer while
the writer reads it: under the "wait" policy it waits until the writer has written the previous
save's chunks (publishing that one goes on meanwhile; it can take a lease settle of a second or
so); under "skip" it is skipped while an earlier save is unfinished. A failed or killed
background save is reported through `last_error` / `wait()`, not raised into the training
loop; the next save starts a new writer when needed. The writer spreads a save over half the
time between saves (pacing.py) unless something waits for it. A loop that changes its state only
in its optimizer step can have the copy made beside its next forward and backward (`overlap`,
then `ready()` before the step), so it stalls only for what of the copy they did not cover.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

import torch

from training_platform.checkpoints.layout import manifest_key
from training_platform.checkpoints.manifest import CheckpointManifest
from training_platform.checkpoints.pacing import SaveCadence
from training_platform.checkpoints.retention import RetentionPolicy
from training_platform.checkpoints.serialization import dtype_name, flatten_state
from training_platform.checkpoints.store import CheckpointStore
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)

_ALIGN = 64
KEPT_RESULTS = 100


@dataclass
class SaveResult:
    """What became of one save_async call."""

    run_id: str
    step: int
    manifest: CheckpointManifest | None = None
    error: str | None = None
    skipped: bool = False
    stall_seconds: float = 0.0
    background_seconds: float = 0.0
    pruned: list[int] = field(default_factory=list)
    """steps the writer removed afterwards (the run's retention policy)"""
    prune_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.manifest is not None


class _StagingBuffer:
    """A memfd the writer maps through /proc/<pid>/fd/<fd>; nothing to leak if we are killed."""

    def __init__(self, size: int):
        self.size = max(size, 1)
        self.fd = os.memfd_create("tp-checkpoint-staging", 0)
        os.ftruncate(self.fd, self.size)
        # MAP_POPULATE faults every page in now, so the first snapshot runs at memcpy speed.
        self.map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
        self.pinned = False

    def pin(self) -> None:
        """Page-lock the buffer for CUDA, so GPU tensors are copied at full PCIe speed, asynchronously."""
        if not self.pinned:
            code = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.size, 0)
            self.pinned = int(code) == 0
            if not self.pinned:
                log.warning("could not pin the checkpoint staging buffer (CUDA error %s); copies are slower", code)

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
        del self.tensor
        with contextlib.suppress(BufferError):  # a view is still alive; freed with it
            self.map.close()
        os.close(self.fd)


def _written_events(tensors: list[torch.Tensor]) -> dict[torch.device, torch.cuda.Event]:
    """For each GPU the tensors are on, an event on the caller's current stream there: a copy that waits for it
    reads the tensors as the kernels queued so far leave them."""
    events = {}
    for device in {tensor.device for tensor in tensors if tensor.is_cuda}:
        events[device] = torch.cuda.Event()
        events[device].record(torch.cuda.current_stream(device))
    return events


class AsyncCheckpointer:
    """Checkpoint a training state in the background; `save_async` returns after the snapshot (with
    `overlap`, once its copy has started).

    `priority` is the writer's CPU priority while the training loop runs: "idle" (SCHED_IDLE:
    it uses only CPU time the loop leaves unused, so steps do not slow down; the default),
    "low" (nice 10) or "normal". Whenever the caller blocks on a save (`wait()`, `close()`, or
    a new save under the "wait" policy) the writer is raised to normal priority, so a busy
    loop can never starve a save it is waiting for.

    `paced` (the default): each save is spread over half the time since the saves before it
    (at most a minute; see pacing.py), so it costs the loop less memory bandwidth and disk at
    once; whatever waits for a save (the same moments as above) has the rest written at full speed.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        policy: Literal["wait", "skip"] = "wait",
        priority: Literal["idle", "low", "normal"] = "idle",
        paced: bool = True,
        start_timeout: float = 60.0,
    ):
        if policy not in ("wait", "skip"):
            raise ValueError(f"policy must be 'wait' or 'skip', got {policy!r}")
        if priority not in ("idle", "low", "normal"):
            raise ValueError(f"priority must be 'idle', 'low' or 'normal', got {priority!r}")
        self.store = store
        self.policy = policy
        self.priority = priority
        self._cadence = SaveCadence() if paced else None
        self.start_timeout = start_timeout
        self.results: list[SaveResult] = []
        """the newest KEPT_RESULTS results, oldest first"""
        self.recorded = 0
        """how many results there have been in all (`results` keeps only the newest)"""
        self._staging: _StagingBuffer | None = None
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._pending: deque[tuple[SaveResult, float]] = deque()
        """saves sent to the writer and not yet answered, oldest first, with when they were sent"""
        self._snapshot_in_use: SaveResult | None = None
        """the pending save whose snapshot the writer may still read from the staging buffer"""
        self._writer_ready = False
        self._hurried = False
        """the writer was told that every save sent so far is waited for"""
        self._copier: ThreadPoolExecutor | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        """a copy stream per GPU the saved states were on"""
        self._copying: tuple[Future, dict, float] | None = None
        """an overlapped snapshot being copied: its copy, its request to the writer, the stall so far"""

    # ----- public API ------------------------------------------------------------------------
    def save_async(
        self,
        run_id: str,
        step: int,
        state: Any,
        metrics: dict[str, float] | None = None,
        *,
        retention: RetentionPolicy | None = None,
        keep_snapshot: bool = False,
        overlap: bool = False,
    ) -> None:
        """Snapshot `state` into the staging buffer and hand it to the writer.

        With `overlap`, the snapshot is copied in a thread while the caller goes on, and the caller
        must call `ready()` before it changes any of the state's tensors (a training loop: before
        its optimizer step; its next forward and backward only read them). The loop then stalls
        only for what of the copy its forward and backward did not cover.

        With `retention`, the writer then removes the run's checkpoints the policy does not keep
        (pins kept), so retention's deletes stay off the caller's thread too. With
        `keep_snapshot`, the writer holds the snapshot until the checkpoint is published (the next
        save waits that long), so it can write again a stored chunk that a concurrent garbage
        collection removed while the save settled.

        Raises only for the caller's own bugs (an invalid run id, an unsupported type in the
        state); a failed save is reported through `last_error` / `wait()`.
        """
        started = time.perf_counter()
        pace_seconds = self._cadence.started(time.monotonic()) if self._cadence and not keep_snapshot else 0.0
        self.ready()
        self._receive()
        if self.policy == "skip" and self._pending:
            log.info("checkpoint step %d skipped: step %d is still being written", step, self._pending[0][0].step)
            self._record(SaveResult(run_id, step, skipped=True, error="previous save still running"))
            return
        self._wait_for_staging()
        manifest_key(run_id, step)  # a bad run id is the caller's bug: raise it here, now
        skeleton, tensors = flatten_state(state, to_cpu=False)  # so is an unsupported type
        try:
            self._ensure_writer()
            layout = self._layout(tensors)
            written = _written_events(tensors)  # the state as the caller's streams have it now
            if overlap:
                if self._copier is None:
                    self._copier = ThreadPoolExecutor(1, thread_name_prefix="tp-ckpt-copy")
                copy = self._copier.submit(self._copy, tensors, layout, written)
            else:
                self._copy(tensors, layout, written)
        except Exception as exc:
            self._record(SaveResult(run_id, step, error=f"snapshot failed: {exc}"))
            return
        request = {
            "op": "save",
            "staging": (os.getpid(), self._staging.fd, self._staging.size),
            "run_id": run_id,
            "step": step,
            "skeleton": skeleton,
            "tensors": layout,
            "metrics": metrics or {},
            # Plain fields, not the object: the writer rebuilds (and re-validates) the policy.
            "retention": asdict(retention) if retention is not None else None,
            "keep_snapshot": keep_snapshot,
            "pace_seconds": pace_seconds,
        }
        if overlap:
            self._copying = (copy, request, time.perf_counter() - started)
            return
        self._send(request, time.perf_counter() - started)

    def ready(self) -> None:
        """Before the caller changes a state it saved with `overlap`: wait for its copy, then hand the save to the
        writer. Nothing to do otherwise."""
        if self._copying is None:
            return
        copy, request, stall = self._copying
        self._copying = None
        started = time.perf_counter()
        try:
            copy.result()
        except Exception as exc:
            self._record(SaveResult(request["run_id"], request["step"], error=f"snapshot failed: {exc}"))
            return
        self._send(request, stall + time.perf_counter() - started)

    def _send(self, request: dict, stall: float) -> None:
        request["stall_seconds"] = stall
        result = SaveResult(request["run_id"], request["step"], stall_seconds=stall)
        self._pending.append((result, time.monotonic()))
        self._snapshot_in_use = result
        try:
            self._set_writer_priority(self.priority)
            self._conn.send(request)
            self._hurried = False
        except OSError:
            self.wait()  # the writer is gone: record why, restart on the next save

    def save(
        self,
        run_id: str,
        step: int,
        state: Any,
        metrics: dict[str, float] | None = None,
        *,
        retention: RetentionPolicy | None = None,
    ) -> SaveResult:
        """Save and return once the checkpoint is published (an emergency save before a preemption)."""
        self.wait()
        self.save_async(run_id, step, state, metrics, retention=retention, keep_snapshot=True)
        return self.wait()

    def reserve(self, state: Any) -> None:
        """Allocate the staging buffer for a state this size now, before training starts."""
        self.ready()
        self._wait_for_staging()
        _, tensors = flatten_state(state, to_cpu=False)
        self._ensure_buffer(sum(_aligned(t.numel() * t.element_size()) for t in tensors))
        self._ensure_writer()

    def poll(self) -> None:
        """Take the answers that have arrived (into `results`), without waiting for more."""
        self._receive()

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """Block until every save in flight ends; returns the last save's result (None if none yet)."""
        self.ready()
        self._receive(until=lambda: not self._pending, timeout=timeout)
        return self.results[-1] if self.results else None

    @property
    def in_flight(self) -> bool:
        self._receive()
        return bool(self._pending) or self._copying is not None

    @property
    def last_error(self) -> str | None:
        """The error of the most recent finished save that failed, or None if it succeeded."""
        self._receive()
        finished = [r for r in self.results if not r.skipped]
        return finished[-1].error if finished else None

    @property
    def writer_pid(self) -> int | None:
        return self._process.pid if self._process and self._process.poll() is None else None

    def close(self) -> None:
        """Finish the saves in flight, stop the writer, free the staging buffer."""
        self.wait()
        # A writer started but never used may still be starting: it is stopped without a word.
        if self._writer_ready and self._conn is not None and self._process is not None and self._process.poll() is None:
            try:
                self._conn.send({"op": "stop"})
                self._conn.recv()
            except (OSError, EOFError):
                pass
        self._stop_writer()
        if self._copier is not None:
            self._copier.shutdown()
            self._copier = None
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- snapshot ----------------------------------------------------------------------------
    def _layout(self, tensors: list[torch.Tensor]) -> list[tuple[int, int, str, list[int]]]:
        """Where each tensor goes in the staging buffer (grown to hold them all): (offset, size, dtype, shape)."""
        sizes = [t.numel() * t.element_size() for t in tensors]
        self._ensure_buffer(sum(_aligned(s) for s in sizes))
        layout, offset = [], 0
        for tensor, size in zip(tensors, sizes, strict=True):
            layout.append((offset, size, dtype_name(tensor.dtype), list(tensor.shape)))
            offset += _aligned(size)
        return layout

    def _copy(
        self,
        tensors: list[torch.Tensor],
        layout: list[tuple[int, int, str, list[int]]],
        written: dict[torch.device, torch.cuda.Event],
    ) -> None:
        """Copy the tensors into the staging buffer. On a GPU: on a side stream of each device, after the kernels
        the caller had queued when it saved (WRITTEN: an event on its stream), so the copy engine runs beside the
        next step's kernels instead of queued between them; waits for those copies only."""
        staging = self._staging.tensor
        if written:
            self._staging.pin()
        streams = {device: self._side_stream(device, event) for device, event in written.items()}
        for tensor, (offset, size, _, _) in zip(tensors, layout, strict=True):
            if not size:
                continue
            with torch.cuda.stream(streams[tensor.device]) if tensor.is_cuda else contextlib.nullcontext():
                source = tensor.contiguous().reshape(-1).view(torch.uint8)
                # Device-to-host copies into pinned memory run asynchronously; one sync per device below.
                staging[offset : offset + size].copy_(source, non_blocking=tensor.is_cuda)
        for stream in streams.values():
            stream.synchronize()

    def _side_stream(self, device: torch.device, written: torch.cuda.Event) -> torch.cuda.Stream:
        """DEVICE's copy stream (made once), waiting for WRITTEN."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        stream.wait_event(written)
        return stream

    def _ensure_buffer(self, size: int) -> None:
        if self._staging is not None and self._staging.size >= size:
            return
        if self._staging is not None:
            self._staging.close()
        # Headroom so a state that grows a little (a new optimizer slot) does not reallocate.
        self._staging = _StagingBuffer(int(size * 1.1) + (1 << 20))

    # ----- the writer process ---------------------------------------------------------------------
    def start_writer(self) -> None:
        """Start the writer process now, without waiting for it: it gets ready while the caller
        builds its model, and the first save does not pay for an interpreter start."""
        if self._process is not None and self._process.poll() is None:
            return
        self._stop_writer()
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = "1"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "training_platform.checkpoints.writer_process", str(child.fileno())],
            pass_fds=[child.fileno()],
            env=env,
            # Its own session: signals aimed at the trainer's process group (torchrun tearing down a
            # failed group, an engine's preemption) do not cut a save short; it leaves on EOF.
            start_new_session=True,
        )
        child.close()
        self._conn = Connection(parent.detach())
        self._conn.send(
            {
                "storage": self.store.storage,
                "cold": self.store.cold,
                "signer": self.store.signer,  # over the socketpair: the key never reaches argv or a file
                "lease_settle_seconds": self.store.lease_settle_seconds,
            }
        )
        self._writer_ready = False

    def _ensure_writer(self) -> None:
        self.start_writer()
        if self._writer_ready:
            return
        if not self._conn.poll(self.start_timeout):
            self._stop_writer()
            raise CheckpointError(f"the background checkpoint writer did not start in {self.start_timeout} s")
        self._conn.recv()
        self._writer_ready = True

    def _stop_writer(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None

    def _set_writer_priority(self, priority: str) -> None:
        """Set the CPU priority of every writer thread (new threads inherit the main thread's).

        The trainer does this, not the writer, so a raise while waiting can never be undone by
        a lowering that arrives late.
        """
        if self._process is None or not hasattr(os, "SCHED_IDLE"):
            return
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{self._process.pid}/task")]
        except OSError:
            return
        policy = os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER
        for tid in threads:
            with contextlib.suppress(OSError):  # a thread that just ended, or not permitted
                os.sched_setscheduler(tid, policy, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, 10 if priority == "low" else 0)

    def _receive(self, until: Callable[[], bool] | None = None, timeout: float | None = None) -> None:
        """Take the writer's messages that have arrived; with `until`, wait for more until it holds."""
        if until is not None and not until():  # the caller waits on the writer now
            if self.priority != "normal":
                self._set_writer_priority("normal")
            self._hurry()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending and not (until is not None and until()):
            try:
                if self._conn is not None and self._conn.poll(0 if until is None else 0.05):
                    self._take(self._conn.recv())
                    continue
            except (EOFError, OSError):
                pass
            if self._process is None or self._process.poll() is not None:
                self._writer_died()
                return
            if until is None or (deadline is not None and time.monotonic() > deadline):
                return

    def _hurry(self) -> None:
        """Have the writer write every save sent so far at full speed."""
        if self._hurried or not self._pending or self._conn is None:
            return
        with contextlib.suppress(OSError):  # a writer that is gone is found by the wait
            self._conn.send({"op": "hurry"})
            self._hurried = True

    def _wait_for_staging(self) -> None:
        """Until the writer no longer reads the staging buffer (it may then be overwritten or replaced)."""
        self._receive(until=lambda: self._snapshot_in_use is None)

    def _take(self, message: dict) -> None:
        if "released" in message:  # the writer has read the oldest held snapshot
            self._snapshot_in_use = None
            return
        result, sent_at = self._pending.popleft()
        if result is self._snapshot_in_use:
            self._snapshot_in_use = None
        result.background_seconds = time.monotonic() - sent_at
        if message.get("ok"):
            manifest = CheckpointManifest.model_validate_json(message["manifest"])
            key = f"runs/{manifest.run_id}/{manifest.step:012d}.json"
            result.manifest = manifest.model_copy(update={"uri": f"{message['uri']}/{key}", "tier": "hot"})
            result.pruned, result.prune_error = message.get("pruned", []), message.get("prune_error")
        else:
            result.error = message.get("error", "unknown error")
        self._record(result)

    def _writer_died(self) -> None:
        code = None if self._process is None else self._process.returncode
        error = (
            f"the background checkpoint writer died (exit code {code}) while saving; "
            "the previous checkpoint is intact and the next save starts a new writer"
        )
        while self._pending:
            self._take({"ok": False, "error": error})
        self._stop_writer()

    def _record(self, result: SaveResult) -> None:
        if result.error and not result.skipped:
            log.warning("checkpoint step %d of run %s failed: %s", result.step, result.run_id, result.error)
        self.results.append(result)
        self.recorded += 1
        del self.results[:-KEPT_RESULTS]  # a long run keeps only recent results in memory


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN
