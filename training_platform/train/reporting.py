"""Where the worker's progress goes: stdout, Dagster Pipes (when launched by Dagster), MLflow.

Only the main rank reports. Pipes is opened only when the launcher set it up, so the same
worker runs under Dagster, from a shell, or in a pod without Dagster.

MLflow metrics are buffered and written in one batch every MLFLOW_FLUSH_SECONDS and when the
run ends: one database transaction per log step cost 5% of a small model's steps, and a batch
every 5 s still took rank 0 ~45 ms per 9 s of a GPT-tiny loop on two busy cores (0.5%). Points
keep the time they were taken, so MLflow's curves are exact, only up to 30 s late. A thread of
their own writes them: while a tracking server is down, MLflow's client retries for minutes, and
the training loop (and every rank waiting on rank 0) must not wait with it. Points the server
does not take stay buffered for the next flush.

Lines that repeat through a run (metrics, checkpoints) reach Dagster's run log at most once per
PIPES_PROGRESS_SECONDS each: every Pipes log line becomes an event-log transaction in the Dagster
process, which on a node whose cores all run ranks takes its CPU from training (with a line per
log step, storing them was 92% of the Dagster process's CPU during a small model's loop). The
worker's own log keeps every line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("training_platform.worker")
PIPES_CONTEXT_ENV_VAR = "DAGSTER_PIPES_CONTEXT"  # dagster_pipes.DAGSTER_PIPES_CONTEXT_ENV_VAR
MLFLOW_FLUSH_SECONDS = 30.0
MLFLOW_CLOSE_SECONDS = 300.0  # how long the end of a run waits for a tracking server to take its last points
MLFLOW_RETRY_SECONDS = 5.0  # between those tries
PIPES_PROGRESS_SECONDS = 10.0


class Reporter:
    def __init__(self, enabled: bool, run_dir: Path | None = None, run_id: str | None = None):
        self.enabled = enabled
        self._stack = contextlib.ExitStack()
        self._pipes = None
        self._mlflow = None
        self._unsent: list[tuple[str, float, int, int]] = []  # metric points not yet in MLflow
        self._unsent_lock = threading.Lock()
        self._sending = threading.Lock()  # one write to MLflow at a time, so points keep their order
        self._due = threading.Event()  # wakes the sender before its interval is up
        self._closing = False
        self._sender: threading.Thread | None = None
        self._outage = False  # the last write failed: say so once, and once more when it recovers
        self._sent_at = time.monotonic()
        self._progress_sent: dict[str, float] = {}  # kind -> when its last line went to Pipes
        self._progress_held: dict[str, str] = {}  # kind -> its newest line not sent to Pipes yet
        self.mlflow_run_id = os.environ.get("MLFLOW_RUN_ID") or None
        if not enabled:
            return
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
        # Entered first, so that its last push comes after Pipes closed: the messages file is complete then.
        messages = _push_run_files(self._stack, run_dir, run_id)
        # Checked before importing: a worker started outside Dagster needs no dagster-pipes.
        if os.environ.get(PIPES_CONTEXT_ENV_VAR):
            from dagster_pipes import open_dagster_pipes

            params = _messages_into(messages) if messages else None
            self._pipes = self._stack.enter_context(open_dagster_pipes(params_loader=params))
        if self.mlflow_run_id:
            from mlflow.tracking import MlflowClient

            self._mlflow = MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"))
            self._sender = threading.Thread(target=self._send_periodically, name="mlflow-metrics", daemon=True)
            self._sender.start()

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        log.info(message)
        if self._pipes is not None:
            self._send_held_progress()  # the run log keeps the order the lines were written in
            self._pipes.log.info(message)

    def progress(self, kind: str, message: str) -> None:
        """A line of a kind that repeats (metrics, checkpoints): to Dagster at most once per
        PIPES_PROGRESS_SECONDS per kind; the newest one held back goes with the next other line or at close."""
        if not self.enabled:
            return
        log.info(message)
        if self._pipes is None:
            return
        now = time.monotonic()
        if now - self._progress_sent.get(kind, -PIPES_PROGRESS_SECONDS) < PIPES_PROGRESS_SECONDS:
            self._progress_held[kind] = message
            return
        self._progress_sent[kind] = now
        self._progress_held.pop(kind, None)  # this newer line replaces it
        self._send_held_progress()
        self._pipes.log.info(message)

    def _send_held_progress(self) -> None:
        for message in self._progress_held.values():
            self._pipes.log.info(message)
        self._progress_held.clear()

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled or not values:
            return
        self.progress("metrics", f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
        if self._mlflow is None:
            return
        timestamp = _now_ms()
        self._buffer([(key, float(value), timestamp, step) for key, value in values.items()])
        if time.monotonic() - self._sent_at >= MLFLOW_FLUSH_SECONDS:
            self._due.set()

    def metric_series(self, points: list[tuple[str, float, int, int]]) -> None:
        """Log (key, value, timestamp ms, step) points to MLflow (system metrics, figures) with the next write."""
        if self.enabled and self._mlflow is not None and points:
            self._buffer(points)
            self._due.set()

    def flush_metrics(self) -> None:
        """Write the buffered metric points to MLflow now, on this thread; points MLflow does not take stay."""
        if self._mlflow is not None:
            self._send()

    def _buffer(self, points: list[tuple[str, float, int, int]]) -> None:
        with self._unsent_lock:
            self._unsent.extend(points)

    def _send_periodically(self) -> None:
        while not self._closing:
            self._due.wait(timeout=MLFLOW_FLUSH_SECONDS)
            self._due.clear()
            self._send()

    def _send(self) -> bool:
        """One attempt to write every buffered point; False when MLflow did not take them (they stay buffered)."""
        from mlflow.entities import Metric

        with self._sending:
            self._sent_at = time.monotonic()
            with self._unsent_lock:
                points, self._unsent = self._unsent, []
            if not points:
                return True
            batch = [Metric(key, float(value), ts, step) for key, value, ts, step in points]
            try:
                for start in range(0, len(batch), 1000):  # MLflow's batch limit
                    self._mlflow.log_batch(self.mlflow_run_id, metrics=batch[start : start + 1000], synchronous=True)
                    del points[: min(1000, len(points))]  # written: not to be written twice
            except Exception as exc:  # noqa: BLE001 - an MLflow outage must not stop training (or its emergency exit)
                with self._unsent_lock:
                    self._unsent[:0] = points
                if not self._outage:
                    log.warning(
                        "MLflow did not take %d metric points (%s); they stay buffered and are retried",
                        len(points),
                        exc,
                    )
                self._outage = True
                return False
            if self._outage:
                log.info("MLflow takes metrics again; the buffered points are written")
            self._outage = False
            return True

    def _stop_sender(self) -> None:
        """Stop the sender thread, then write what is left, trying until MLFLOW_CLOSE_SECONDS have passed."""
        if self._sender is None:
            return
        self._closing = True
        self._due.set()
        self._sender.join()
        self._sender = None
        deadline = time.monotonic() + MLFLOW_CLOSE_SECONDS
        while not self._send():
            if time.monotonic() >= deadline:
                with self._unsent_lock:
                    lost = len(self._unsent)
                log.warning(
                    "MLflow did not take the run's last %d metric points within %.0f s; they are lost",
                    lost,
                    MLFLOW_CLOSE_SECONDS,
                )
                return
            time.sleep(min(MLFLOW_RETRY_SECONDS, max(0.0, deadline - time.monotonic())))

    def _flush(self) -> None:
        if self._pipes is not None:
            self._send_held_progress()
        self._stop_sender()

    def artifacts(self, paths: list[Any], artifact_path: str) -> None:
        if self.enabled and self._mlflow is not None:
            for path in paths:
                self._mlflow.log_artifact(self.mlflow_run_id, str(path), artifact_path=artifact_path)

    def materialization(self, metadata: dict[str, Any]) -> None:
        if self.enabled and self._pipes is not None:
            self._pipes.report_asset_materialization(metadata=metadata)

    def close(self) -> None:
        try:
            self._flush()
        finally:
            self._stack.close()

    def fail(self, exc: BaseException) -> None:
        """Close Pipes with the exception so Dagster shows the user's traceback."""
        try:
            self._flush()
        finally:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)


def _push_run_files(stack: contextlib.ExitStack, run_dir: Path | None, run_id: str | None) -> Path | None:
    """Push the run directory to the run store until the stack closes, where one is set; then the Pipes messages
    file to write (in the run directory, pushed with the rest)."""
    from training_platform.paths import RUN_STORE_ENV

    if not os.environ.get(RUN_STORE_ENV) or run_dir is None or run_id is None:
        return None  # a shared disk: nothing to push (and run_files' imports are not paid for)
    from training_platform.runs.remote_files import ATTEMPT_ENV, PIPES_MESSAGES_FILE, RunFilesPusher, run_store_from_env

    storage = run_store_from_env()
    pusher = RunFilesPusher(storage, run_id, run_dir, os.environ.get(ATTEMPT_ENV) or "unattributed").start()
    stack.callback(pusher.close)
    return run_dir / PIPES_MESSAGES_FILE


def _messages_into(path: Path) -> Any:
    """Pipes' parameters with the messages file moved into this job's run directory: the path Dagster gave is
    on its own disk, which a pod does not have."""
    from dagster_pipes import PipesDefaultMessageWriter, PipesEnvVarParamsLoader

    class MessagesInto(PipesEnvVarParamsLoader):  # here: dagster_pipes is imported only where Pipes is open
        def load_messages_params(self) -> dict[str, Any]:
            return {**super().load_messages_params(), PipesDefaultMessageWriter.FILE_PATH_KEY: str(path)}

    return MessagesInto()


def _now_ms() -> int:
    return int(time.time() * 1000)
