"""The main rank's checkpoint writer: periodic saves in the background, emergency saves waited for.

With `checkpoint.async_save` (the default) the training loop blocks only while the state is
copied into shared memory; a separate writer process hashes, deduplicates and writes it, then
applies the run's retention policy, so the save does not fight the loop for the GIL. A new save
waits until the writer has read the previous one's snapshot, not until that one is published.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from training_platform.checkpoints import AsyncCheckpointer, CheckpointManifest, CheckpointStore, RetentionPolicy
from training_platform.spec import CheckpointSpec

log = logging.getLogger(__name__)


def retention_policy(checkpoint: CheckpointSpec) -> RetentionPolicy:
    """The spec's retention fields as the store's policy (a checkpoint any rule keeps stays)."""
    best = checkpoint.keep_best
    return RetentionPolicy(
        keep_last=checkpoint.keep_last,
        keep_best=best.count if best else 0,
        best_metric=best.metric if best else None,
        best_mode=best.mode if best else "min",
        keep_every=checkpoint.keep_every_steps or 0,
    )


class RunCheckpointer:
    def __init__(
        self,
        store: CheckpointStore,
        key: str,
        *,
        retention: RetentionPolicy,
        background: bool,
        on_saved: Callable[[CheckpointManifest], None],
        on_failed: Callable[[int, str], None],
    ):
        self.store = store
        self.key = key
        self.retention = retention
        self.on_saved = on_saved
        self.on_failed = on_failed
        self._saver = AsyncCheckpointer(store, policy="wait") if background else None
        self._seen = 0

    def start(self) -> None:
        """Start the background writer now, so that the first save does not wait for it to start."""
        if self._saver is not None:
            self._saver.start_writer()

    def save(
        self, step: int, state: Any, metrics: dict[str, float] | None, *, wait: bool, overlap: bool = False
    ) -> None:
        """`overlap`: a periodic save's copy runs beside the caller, which calls `ready()` before it changes the state
        (AsyncCheckpointer.save_async)."""
        if self._saver is None:
            manifest, _ = self.store.save(self.key, step, state, metrics)
            self.store.apply_retention(self.key, self.retention)
            self.on_saved(manifest)
            return
        if wait:
            self._saver.save(self.key, step, state, metrics, retention=self.retention)
        else:
            self._saver.save_async(self.key, step, state, metrics, retention=self.retention, overlap=overlap)
        self._collect()

    def ready(self) -> None:
        """The caller is about to change the state it saved with `overlap`: its copy completes first."""
        if self._saver is not None:
            self._saver.ready()

    def poll(self) -> None:
        """Report the background saves that have finished, without waiting for any."""
        if self._saver is not None:
            self._saver.poll()
            self._collect()

    def flush(self) -> None:
        """Wait for the save in flight, then report what became of every save."""
        if self._saver is not None:
            self._saver.wait()
            self._collect()

    def close(self) -> None:
        self.flush()
        if self._saver is not None:
            self._saver.close()

    def _collect(self) -> None:
        # By count, not by index: the saver keeps only its newest results.
        fresh = self._saver.recorded - self._seen
        for result in self._saver.results[-fresh:] if fresh else []:
            if result.prune_error:
                log.warning("older checkpoints of %s stay: retention failed: %s", self.key, result.prune_error)
            if result.ok:
                self.on_saved(result.manifest)
            elif not result.skipped:
                self.on_failed(result.step, result.error or "unknown error")
        self._seen = self._saver.recorded
