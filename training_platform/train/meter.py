"""Step telemetry for the loop: step time, throughput, time waiting for data, MFU.

Times are averaged over the steps since the last report. The loop reports at log steps, where
``loss.item()`` has already synchronized the device, so the wall clock covers finished work.
"""

from __future__ import annotations

import time
from contextlib import contextmanager


class StepMeter:
    def __init__(
        self,
        samples_per_step: int,
        tokens_per_sample: int = 0,
        flops_per_sample: float | None = None,
        peak_flops: float | None = None,
    ):
        self.samples_per_step = samples_per_step
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.total_wait = 0.0
        self.total_steps = 0
        self.first_fetch_unix: float | None = None
        self._first_fetch: float | None = None
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self._since = now
        self._steps = 0
        self._wait = 0.0

    @contextmanager
    def waiting_for_data(self):
        started = time.perf_counter()
        if self._first_fetch is None:
            self._first_fetch, self.first_fetch_unix = started, time.time()
        try:
            yield
        finally:
            waited = time.perf_counter() - started
            self._wait += waited
            self.total_wait += waited

    def step_done(self) -> None:
        self._steps += 1
        self.total_steps += 1

    def report(self) -> dict[str, float]:
        """Averages since the previous report; then start a new window."""
        now = time.perf_counter()
        elapsed, steps = now - self._since, max(self._steps, 1)
        step_time = elapsed / steps
        metrics = {
            "step_time_s": step_time,
            "samples_per_s": self.samples_per_step / step_time,
            "data_wait_s": self._wait / steps,
            "data_wait_fraction": self._wait / elapsed if elapsed > 0 else 0.0,
        }
        if self.tokens_per_sample:
            metrics["tokens_per_s"] = self.samples_per_step * self.tokens_per_sample / step_time
        if self.flops_per_sample and self.peak_flops:
            metrics["mfu"] = self.samples_per_step * self.flops_per_sample / step_time / self.peak_flops
        self._reset(now)
        return metrics

    def summary(self) -> dict[str, float]:
        """The whole loop: from the first batch fetch to now (checkpoints and evaluations included)."""
        seconds = time.perf_counter() - self._first_fetch if self._first_fetch is not None else 0.0
        return {
            "steps": self.total_steps,
            "loop_seconds": seconds,
            "steps_per_s": self.total_steps / seconds if seconds > 0 else 0.0,
            "data_wait_s": self.total_wait,
            "data_wait_fraction": self.total_wait / seconds if seconds > 0 else 0.0,
            "first_step_unix": self.first_fetch_unix or 0.0,
        }
