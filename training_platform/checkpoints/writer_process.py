"""The background writer: a separate process that turns a staged snapshot into a checkpoint.

Started by AsyncCheckpointer as ``python -m training_platform.checkpoints.writer_process FD``
(a fresh interpreter, not a fork: it shares no locks, threads or rendezvous ports with the
trainer, so it works under torchrun). It imports no torch. It reads the snapshot from the
trainer's memfd staging buffer through /proc, writes chunks and the manifest, applies the
run's retention when asked (`keep_last`), and answers with the manifest or the error. When
the trainer goes away its socket closes and this exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection

from training_platform.checkpoints.store import CheckpointStore
from training_platform.checkpoints.writer import Blob, write_checkpoint


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


def serve(conn: Connection) -> None:
    init = conn.recv()
    storage, settle = init["storage"], init["lease_settle_seconds"]
    store = CheckpointStore(storage, init.get("cold"), lease_settle_seconds=settle)
    staging = _Staging()
    conn.send({"ready": True, "pid": os.getpid()})
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request["op"] == "stop":
            conn.send({"stopped": True})
            return
        buffer = blobs = None
        try:
            buffer = staging.view(*request["staging"])
            blobs = [
                Blob(data=buffer[offset : offset + size], dtype=dtype, shape=shape)
                for offset, size, dtype, shape in request["tensors"]
            ]
            manifest, stats = write_checkpoint(
                storage,
                request["run_id"],
                request["step"],
                skeleton=request["skeleton"],
                blobs=blobs,
                metrics=request["metrics"],
                stall_seconds=request["stall_seconds"],
                lease_settle_seconds=settle,
            )
            reply = {"ok": True, "manifest": manifest.model_dump_json(), "uri": storage.uri}
            if request.get("keep_last"):
                reply |= _retain(store, request["run_id"], request["keep_last"])
            conn.send(reply)
        except Exception as exc:  # reported to the trainer, never raised into its loop
            conn.send({"ok": False, "error": _describe(exc)})
        finally:
            del buffer, blobs  # release the staging views so a grown buffer can be remapped


def _retain(store: CheckpointStore, run_id: str, keep_last: int) -> dict:
    """Drop the run's checkpoints beyond the newest `keep_last`, here rather than on the training
    thread (one prune took 0.2 s there); a failure leaves extra checkpoints only."""
    try:
        return {"pruned": store.prune(run_id, keep_last)}
    except Exception as exc:
        return {"prune_error": _describe(exc)}


def _describe(exc: Exception) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def main() -> None:
    # A preemption signals the whole process group. The writer finishes the save in flight (the
    # trainer waits for it inside the grace period) and leaves when the trainer closes the socket.
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
