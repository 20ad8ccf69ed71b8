"""A background thread that samples this node's devices at a fixed interval.

Only one process per node runs it (local rank 0); the training thread never waits on it:
a sample is a few /proc reads or NVML calls, taken while the training thread keeps working.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from training_platform.telemetry.samplers import Sampler, SystemSample, open_sampler

DEFAULT_INTERVAL_S = 1.0
INTERVAL_ENV = "TP_TELEMETRY_INTERVAL_S"


class SystemMonitor:
    """Samples `sampler` every `interval_s` seconds in a daemon thread until `stop()`."""

    def __init__(
        self,
        sampler: Sampler | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_sample: Callable[[SystemSample], None] | None = None,
        max_samples: int = 100_000,
    ):
        if interval_s <= 0:
            raise ValueError(f"telemetry interval must be > 0 seconds (got {interval_s}); set {INTERVAL_ENV}")
        self.sampler = sampler or open_sampler()
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.max_samples = max_samples
        self.samples: list[SystemSample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tp-telemetry", daemon=True)

    @property
    def device(self) -> str:
        return self.sampler.device

    def start(self) -> SystemMonitor:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def sample_once(self) -> SystemSample | None:
        try:
            sample = self.sampler.sample()
        except Exception as exc:  # noqa: BLE001 - telemetry must never kill a training run
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
        with self._lock:
            if len(self.samples) >= self.max_samples:
                # Keep every other sample: the picture stays whole at half the resolution.
                self.samples = self.samples[::2]
            self.samples.append(sample)
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception as exc:  # noqa: BLE001 - a failing writer must not stop sampling
                self.errors.append(f"on_sample: {type(exc).__name__}: {exc}")
        return sample

    def snapshot(self) -> list[SystemSample]:
        with self._lock:
            return list(self.samples)

    def stop(self) -> list[SystemSample]:
        """Stop sampling (one last sample so short runs have at least one) and return the samples."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self.sample_once()
        self.sampler.close()
        return self.snapshot()

    def __enter__(self) -> SystemMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
