"""What users and schedulers see of a run while it trains: its progress as run tags, the worker's log on the
run's stdout, and its last durable checkpoint on the job itself (checkpoints/durable.py).

The tags (`tp/step`, `tp/max_steps`, `tp/metrics`, `tp/cost_usd`) show in the UI's run list and let
`tp train`, `tp runs` and `tp logs` follow a run through the server's API alone. The worker's log
(rank 0's lines and any rank's errors) goes to this process's stdout, which Dagster captures: the
UI's stdout view and `tp logs` read it from there, wherever the job runs.
"""

from __future__ import annotations

import sys
import time

import dagster as dg

from training_platform.checkpoints.durable import DurableCheckpoint, newest_checkpoint
from training_platform.launch import JobHandle, Launcher
from training_platform.runs.events import RunEvents
from training_platform.telemetry.records import read_telemetry

# Throughput figures stay in MLflow and the run's telemetry: the tag shows what a run is learning.
NOT_SHOWN = {"step_time_s", "samples_per_s", "tokens_per_s", "data_wait_s", "data_wait_fraction", "epoch", "mfu"}
TAGS_EVERY_S = 2.0  # a run-storage write each; the UI and `tp` poll about once a second
LOG_EVERY_S = 3.0  # Slurm and Kubernetes logs are read whole (scontrol, the API): not every poll
CHECKPOINT_REFRESH_S = 60.0  # a Job's `-checkpointed` class lapses as its save grows old (checkpoints/durable.py)


class LiveRun:
    def __init__(self, context: dg.AssetExecutionContext, launcher: Launcher, handle: JobHandle, run_dir, max_steps):
        self.context = context
        self.launcher = launcher
        self.handle = handle
        self.run_dir = run_dir
        self._tags: dict[str, str] = {}
        self._tags_at = self._log_at = time.monotonic()
        self._events, self._events_read = RunEvents(run_dir), 0
        self._checkpoint: DurableCheckpoint | None = None  # the newest one seen; published once that succeeded
        self._published: DurableCheckpoint | None = None
        self._published_at = 0.0
        # The log of a local or Slurm job is appended to by every attempt: echo this attempt's part only.
        self._echoed = len(self._log() or "")
        self._guarded(self._publish, {"tp/max_steps": str(max_steps)})

    def poll(self, final: bool = False) -> None:
        """Publish what changed since the last poll (all of it when `final`)."""
        now = time.monotonic()
        if final or now - self._tags_at >= TAGS_EVERY_S:
            self._tags_at = now
            self._guarded(self._publish_progress)
        if final or now - self._log_at >= LOG_EVERY_S:
            self._log_at = now
            self._guarded(self._echo_log)
        self._guarded(self._publish_checkpoint)

    def _guarded(self, publish, *args) -> None:
        """A view of the run must never stop the run: what fails now is published at the next poll."""
        try:
            publish(*args)
        except Exception as exc:  # noqa: BLE001 - e.g. the run storage busy for a moment
            self.context.log.debug(f"the run's progress was not published this time: {exc}")

    def _publish_progress(self) -> None:
        telemetry = read_telemetry(self.run_dir)
        if not telemetry:
            return
        tags = {"tp/step": str(telemetry.get("step", 0)), "tp/cost_usd": f"{telemetry.get('cost_usd') or 0:.6f}"}
        metrics = {k: v for k, v in (telemetry.get("metrics") or {}).items() if k not in NOT_SHOWN}
        if metrics:
            tags["tp/metrics"] = ", ".join(f"{k}={_short(v)}" for k, v in sorted(metrics.items()))
        changed = {k: v for k, v in tags.items() if self._tags.get(k) != v}
        if changed:
            self._publish(changed)

    def _publish(self, tags: dict[str, str]) -> None:
        self.context.instance.add_run_tags(self.context.run_id, tags)
        self._tags.update(tags)

    def _publish_checkpoint(self) -> None:
        """Each new durable checkpoint onto the job (a Slurm comment, Job annotations), where the launcher can."""
        publish = getattr(self.launcher, "publish_checkpoint", None)
        if publish is None:
            return
        events, self._events_read = self._events.read_from(self._events_read)
        self._checkpoint = newest_checkpoint(events) or self._checkpoint
        now = time.monotonic()
        due = self._checkpoint != self._published or now - self._published_at >= CHECKPOINT_REFRESH_S
        if self._checkpoint is not None and due:
            publish(self.handle, self._checkpoint)
            self._published, self._published_at = self._checkpoint, now

    def _echo_log(self) -> None:
        text = self._log()
        if text is None:
            return
        if len(text) < self._echoed:  # a new log file (a new Slurm job id, a new pod)
            self._echoed = 0
        if len(text) > self._echoed:
            sys.stdout.write(text[self._echoed :])
            sys.stdout.flush()
            self._echoed = len(text)

    def _log(self) -> str | None:
        try:
            return self.launcher.logs(self.handle)
        except Exception:  # noqa: BLE001 - a log the backend cannot serve now is read at the next poll
            return None


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)[:40]
