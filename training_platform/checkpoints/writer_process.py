"""The background writer: a separate process that turns a staged snapshot into a checkpoint.

Started by AsyncCheckpointer as ``python -m training_platform.checkpoints.writer_process FD``
(a fresh interpreter, not a fork: it shares no locks, threads or rendezvous ports with the
trainer, so it works under torchrun). It imports no torch. It reads the snapshot from the
trainer's memfd staging buffer through /proc, writes chunks and the manifest, applies the
run's retention policy when asked, and answers with the manifest or the error. A trainer that
closes the checkpointer ("stop") has every save it handed over published first. A trainer that
dies instead (SIGKILL, the OOM killer) takes its unpublished saves with it: its job is reported
failed, and a checkpoint that appeared later would change what the failed run left (and what a
retry of it resumes from). The writer tells by its parent, the trainer, changing under it.

Two stages per save: the main loop writes the chunks, then (unless the trainer waits for this
save) tells the trainer it may reuse its buffer ("released"); a publisher thread finishes the
saves in order (a save that reused stored chunks waits out the lease settle, a second or so,
before its manifest goes out) and sends each answer. So a run whose saves reuse chunks (a
reproduction re-saves the same bytes) does not stall its loop on every settle.

A save is written at the pace the trainer asks for (pacing.py); a reader thread takes the
trainer's messages while a save is written, so its "hurry" (the trainer now waits for every save
it sent) reaches the save in progress.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from training_platform.checkpoints.pacing import PaceControl
from training_platform.checkpoints.retention import RetentionPolicy
from training_platform.checkpoints.store import CheckpointStore
from training_platform.checkpoints.writer import Blob, StagedCheckpoint, stage_checkpoint


class _Staging:
    """The trainer's staging buffer, mapped read-only; remapped when the trainer grows it."""

    def __init__(self) -> None:
        self.key: tuple[int, int, int] | None = None
        self.map: mmap.mmap | None = None

    def view(self, pid: int, fd: int, size: int) -> memoryview:
        if self.key != (pid, fd, size):
            self.close()
            with open(f"/proc/{pid}/fd/{fd}", "rb") as handle:
                self.map = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
            self.key = (pid, fd, size)
        return memoryview(self.map)

    def close(self) -> None:
        if self.map is not None:
            with contextlib.suppress(BufferError):  # a view outlived its save; unmapped with it
                self.map.close()
        self.map, self.key = None, None


class _Publisher:
    """Runs the answers' jobs in the order the saves came, on a thread of its own."""

    def __init__(self, send: Callable[[dict], None]):
        self._send = send
        self._jobs: queue.Queue[Callable[[], dict] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tp-ckpt-publish", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], dict]) -> None:
        self._jobs.put(job)

    def drain(self) -> None:
        """Finish every job submitted so far, then stop."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                reply = job()
            except Exception as exc:  # reported to the trainer, never raised into its loop
                reply = {"ok": False, "error": _describe(exc)}
            with contextlib.suppress(OSError):  # the trainer is gone: nobody reads the answer
                self._send(reply)


def serve(conn: Connection) -> None:
    init = conn.recv()
    storage, settle = init["storage"], init["lease_settle_seconds"]
    store = CheckpointStore(storage, init.get("cold"), signer=init["signer"], lease_settle_seconds=settle)
    staging = _Staging()
    sending = threading.Lock()  # the main loop and the publisher both answer

    def send(message: dict) -> None:
        with sending:
            conn.send(message)

    trainer = os.getppid()

    def trainer_alive() -> bool:
        # Reparented the moment the trainer exits (its socket may close later, or never while staging).
        return os.getppid() == trainer

    publisher = _Publisher(send)
    pace = PaceControl()
    requests: queue.Queue[dict | None] = queue.Queue()
    send({"ready": True, "pid": os.getpid()})
    threading.Thread(target=_read, args=(conn, requests, pace), name="tp-ckpt-requests", daemon=True).start()
    try:
        while (request := requests.get()) is not None:
            if request["op"] == "stop":
                publisher.drain()
                send({"stopped": True})
                return
            publisher.submit(_stage(request, staging, store, send, trainer_alive, pace))
    finally:
        publisher.drain()


def _read(conn: Connection, requests: queue.Queue[dict | None], pace: PaceControl) -> None:
    """The trainer's messages, in order: saves and the stop for the main loop, 'hurry' at once. None: it is gone."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the trainer is gone: nothing waits for a pace any more
            pace.hurry()
            requests.put(None)
            return
        if message["op"] == "hurry":
            pace.hurry()
            continue
        if message["op"] == "save":
            message["number"] = pace.received()
        requests.put(message)
        if message["op"] == "stop":
            return


def _stage(
    request: dict,
    staging: _Staging,
    store: CheckpointStore,
    send: Callable[[dict], None],
    trainer_alive: Callable[[], bool],
    pace: PaceControl,
) -> Callable[[], dict]:
    """Write one save's chunks from the staging buffer; returns the job that publishes it."""
    buffer = blobs = staged = None
    try:
        buffer = staging.view(*request["staging"])
        blobs = [
            Blob(data=buffer[offset : offset + size], dtype=dtype, shape=shape)
            for offset, size, dtype, shape in request["tensors"]
        ]
        staged = stage_checkpoint(
            store.storage,
            request["run_id"],
            request["step"],
            signer=store.signer,
            skeleton=request["skeleton"],
            blobs=blobs,
            metrics=request["metrics"],
            stall_seconds=request["stall_seconds"],
            lease_settle_seconds=store.lease_settle_seconds,
            pacer=pace.pacer(request["number"], request["pace_seconds"]),
        )
    except Exception as exc:
        failure = {"ok": False, "error": _describe(exc)}
    finally:
        del buffer, blobs  # release the staging views so a grown buffer can be remapped
    if not request["keep_snapshot"]:
        if staged is not None:
            staged.release_snapshot()
        # A trainer gone meanwhile is not told (its save is abandoned before the manifest, in _publish).
        with contextlib.suppress(OSError):
            send({"released": request["step"]})
    if staged is None:
        return lambda: failure  # answered in order, after the saves before it
    return lambda: _publish(staged, store, request["run_id"], request.get("retention"), trainer_alive)


def _publish(
    staged: StagedCheckpoint,
    store: CheckpointStore,
    run_id: str,
    retention: dict | None,
    trainer_alive: Callable[[], bool],
) -> dict:
    manifest = staged.finish(still_wanted=trainer_alive)
    reply = {"ok": True, "manifest": manifest.model_dump_json(), "uri": store.storage.uri}
    if retention and trainer_alive():
        reply |= _retain(store, run_id, retention)
    return reply


def _retain(store: CheckpointStore, run_id: str, retention: dict) -> dict:
    """Drop the run's checkpoints its policy does not keep, here rather than on the training
    thread (one prune took 0.2 s there); a failure leaves extra checkpoints only."""
    try:
        return {"pruned": store.apply_retention(run_id, RetentionPolicy(**retention))}
    except Exception as exc:
        return {"prune_error": _describe(exc)}


def _describe(exc: Exception) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def main() -> None:
    # A preemption signals the whole process group. The writer finishes the save in flight (the
    # trainer waits for it inside the grace period, then closes the checkpointer).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    conn = Connection(sock.detach())
    try:
        serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
