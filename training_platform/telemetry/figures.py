"""Run-level figures: step time, throughput, data wait, checkpoint overhead, MFU, cost so far.

`RunClock` is fed by the worker SDK (one `data_wait()` per step, one `checkpoint()` per save);
`run_figures` turns it, the spec and the system samples into the numbers people read.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from training_platform.spec import TrainSpec
from training_platform.telemetry.samplers import SystemSample

SLOW_DATA_ENV = "TP_SLOW_DATA_SECONDS"
"""Seconds to add to every batch fetch: an artificially slow data loader (tests, drills)."""

# Used only when training_platform.cost cannot answer (no price table): $/GPU-hour, $/process-hour.
FALLBACK_GPU_HOUR = 2.0
FALLBACK_CPU_PROCESS_HOUR = 0.048


@dataclass
class RunClock:
    """Where the main rank's wall time goes: waiting for data, saving checkpoints, the rest."""

    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    slow_data_s: float = field(default_factory=lambda: float(os.environ.get(SLOW_DATA_ENV, "0") or 0))
    data_wait_s: float = 0.0
    checkpoint_s: float = 0.0
    steps: int = 0
    step_times: list[float] = field(default_factory=list)
    first_step_at: float | None = None
    _last_step_at: float | None = None

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """Wrap the batch fetch: the time inside counts as data wait, and each entry starts a step."""
        begin = self.step_started()
        if self.slow_data_s > 0:
            time.sleep(self.slow_data_s)
        try:
            yield
        finally:
            self.data_wait_s += time.monotonic() - begin

    def step_started(self, count: int = 1) -> float:
        """Count COUNT steps (a framework's loop, whose batch fetch the platform cannot wrap, calls only this;
        a plain script's `after_step` counts the steps it reports done since the last call)."""
        begin = time.monotonic()
        if self._last_step_at is not None:
            self.step_times.append((begin - self._last_step_at) / count)
        else:
            self.first_step_at = begin
        self._last_step_at = begin
        self.steps += count
        return begin

    @contextlib.contextmanager
    def checkpoint(self) -> Iterator[None]:
        begin = time.monotonic()
        try:
            yield
        finally:
            self.checkpoint_s += time.monotonic() - begin

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def loop_seconds(self) -> float:
        """Wall time since the first step began (set-up before the loop is not the loop's overhead)."""
        return time.monotonic() - self.first_step_at if self.first_step_at is not None else 0.0


@dataclass(frozen=True)
class RunFigures:
    steps: int
    loop_seconds: float
    step_time_s: float | None
    samples_per_s: float | None
    data_wait_fraction: float
    checkpoint_overhead: float
    mfu: float | None
    utilization_pct: float | None
    peak_memory_mb: float | None
    cost_usd: float
    cost_per_hour_usd: float

    def to_dict(self) -> dict:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """The figures that are numbers, for MLflow."""
        return {k: float(v) for k, v in asdict(self).items() if isinstance(v, int | float) and v is not None}


def hourly_rate(spec: TrainSpec, at: datetime | None = None) -> float:
    """What an hour of this run's resources costs: the cost package's prices, else a flat fallback."""
    resources = spec.resources
    gpus = resources.nodes * resources.gpus_per_node
    units = gpus if gpus else resources.world_size
    at = at or datetime.now(UTC)
    try:
        from training_platform.cost.prices import load_price_model

        gpu_type = resources.gpu_type if gpus else None
        if gpus and gpu_type is None:
            return units * FALLBACK_GPU_HOUR
        return units * load_price_model().price_at(gpu_type, resources.spot, at)
    except Exception:  # noqa: BLE001 - a missing or broken price table must not stop a run's report
        return units * (FALLBACK_GPU_HOUR if gpus else FALLBACK_CPU_PROCESS_HOUR)


def _peak_flops(gpu_type: str | None) -> float | None:
    """Dense bf16 peak of one GPU of this type (the hardware table); None for CPU or unknown types."""
    try:
        from training_platform.hardware import GPUS
    except ImportError:
        return None
    gpu = GPUS.get(gpu_type or "")
    return gpu.bf16_tflops * 1e12 if gpu else None


def cost_usd(rate_per_hour: float, seconds: float) -> float:
    return rate_per_hour * seconds / 3600.0


def model_flops_per_sample(num_params: int) -> float:
    """Forward + backward of a dense model: about 6 FLOPs per parameter per sample."""
    return 6.0 * num_params


def run_figures(
    clock: RunClock,
    spec: TrainSpec,
    samples: list[SystemSample],
    num_params: int | None = None,
    rate_per_hour: float | None = None,
    reported_mfu: float | None = None,
) -> RunFigures:
    """`reported_mfu`: the loop's own MFU (it knows the template's FLOPs) wins over the 6 x params estimate."""
    loop_s = clock.loop_seconds()
    step_time = statistics.median(clock.step_times) if clock.step_times else None
    global_batch = spec.training.batch_size * spec.resources.world_size
    samples_per_s = clock.steps * global_batch / loop_s if loop_s > 0 and clock.steps else None
    mfu = reported_mfu
    peak = _peak_flops(spec.resources.gpu_type)
    gpus = spec.resources.nodes * spec.resources.gpus_per_node
    if mfu is None and peak and gpus and num_params and samples_per_s:
        mfu = samples_per_s * model_flops_per_sample(num_params) / (peak * gpus)
    rate = hourly_rate(spec) if rate_per_hour is None else rate_per_hour
    return RunFigures(
        steps=clock.steps,
        loop_seconds=round(loop_s, 3),
        step_time_s=round(step_time, 6) if step_time is not None else None,
        samples_per_s=round(samples_per_s, 2) if samples_per_s else None,
        data_wait_fraction=round(clock.data_wait_s / loop_s, 4) if loop_s > 0 else 0.0,
        checkpoint_overhead=round(clock.checkpoint_s / loop_s, 4) if loop_s > 0 else 0.0,
        mfu=round(mfu, 5) if mfu is not None else None,
        utilization_pct=round(statistics.fmean(s.utilization_pct for s in samples), 2) if samples else None,
        peak_memory_mb=max(s.memory_used_mb for s in samples) if samples else None,
        cost_usd=round(cost_usd(rate, clock.elapsed()), 6),
        cost_per_hour_usd=round(rate, 4),
    )
