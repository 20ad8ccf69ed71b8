"""System samplers: GPU utilization, memory and power through NVML, or CPU and memory through psutil.

A sampler returns one `SystemSample` per call. The CPU sampler measures the training processes
of this node, not the whole host: on a shared machine other users' load must not make an idle
run look busy, nor contention make a busy run look idle.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import psutil


@dataclass(frozen=True)
class SystemSample:
    """One reading of this node's devices; percentages are 0-100."""

    t: float
    """wall-clock time (epoch seconds)"""
    device: str
    """'gpu' (NVML) or 'cpu' (psutil)"""
    utilization_pct: float
    """GPU: mean SM utilization of the devices; CPU: mean busy share of the local training processes"""
    memory_used_mb: float
    """GPU: device memory in use; CPU: resident memory of the training processes"""
    memory_pct: float
    """share of the device (or host) memory in use"""
    power_w: float | None = None
    """GPU board power draw, summed over devices (NVML only)"""
    host_cpu_pct: float | None = None
    """the whole host's CPU utilization, for context"""

    def to_dict(self) -> dict:
        return asdict(self)


class Sampler(Protocol):
    device: str

    def sample(self) -> SystemSample: ...

    def close(self) -> None: ...


def _schedstat_ns(pid: int) -> tuple[int, int] | None:
    """(ns on CPU, ns waiting in the run queue) of a process's main thread, or None without schedstats."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


def local_training_processes(me: psutil.Process | None = None) -> list[psutil.Process]:
    """This node's ranks: the siblings torchrun started with our command line, else this process alone."""
    me = me or psutil.Process()
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return [me]
    try:
        parent = me.parent()
        cmdline = me.cmdline()
        # The name too: ranks forked by a warm standby share its command line with their agent; and the working
        # directory (the run's), as a shared standby forks the ranks of other runs as well.
        alike = (cmdline, me.name(), me.cwd())
        siblings = [p for p in parent.children() if (p.cmdline(), p.name(), p.cwd()) == alike] if parent else []
    except psutil.Error:
        siblings = []
    return siblings or [me]


class CpuSampler:
    """Busy share of the node's training processes: time on a CPU or runnable, over wall time.

    Counting run-queue time as busy (Linux schedstats) keeps the figure honest on a loaded
    host: a process that wants the CPU is not idle. Time spent sleeping (waiting for data, a
    lock, the network) is idle, which is the waste the utilization alert looks for.
    """

    device = "cpu"

    def __init__(self, processes: list[psutil.Process] | None = None):
        self.processes = processes or local_training_processes()
        self._last = self._read()
        psutil.cpu_percent(interval=None)  # primes the host-wide counter

    def _read(self) -> tuple[float, dict[int, float]]:
        busy: dict[int, float] = {}
        for process in self.processes:
            stat = _schedstat_ns(process.pid)
            if stat is not None:
                busy[process.pid] = sum(stat) / 1e9
                continue
            try:  # no schedstats: CPU time of the whole process is the next best thing
                times = process.cpu_times()
                busy[process.pid] = times.user + times.system
            except psutil.Error:
                continue
        return time.monotonic(), busy

    def sample(self) -> SystemSample:
        now, busy = self._read()
        then, before = self._last
        self._last = (now, busy)
        elapsed = max(now - then, 1e-6)
        shares = [min(1.0, (busy[pid] - before[pid]) / elapsed) for pid in busy if pid in before]
        rss = 0
        for process in self.processes:
            try:
                rss += process.memory_info().rss
            except psutil.Error:
                continue
        memory = psutil.virtual_memory()
        return SystemSample(
            t=time.time(),
            device=self.device,
            utilization_pct=round(100.0 * sum(shares) / len(shares), 2) if shares else 0.0,
            memory_used_mb=round(rss / 2**20, 2),
            memory_pct=round(100.0 * rss / memory.total, 3),
            host_cpu_pct=psutil.cpu_percent(interval=None),
        )

    def close(self) -> None:
        pass


class NvmlSampler:
    """GPU utilization, memory and power of this node's devices, read through NVML."""

    device = "gpu"

    def __init__(self, indices: list[int] | None = None):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise RuntimeError("NVML found no GPU on this node")
        self.indices = indices if indices is not None else _visible_gpu_indices(count)
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]

    def sample(self) -> SystemSample:
        nvml = self._nvml
        utilization, used, total, power = [], 0, 0, 0.0
        for handle in self.handles:
            utilization.append(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = used + memory.used, total + memory.total
            with contextlib.suppress(nvml.NVMLError):  # some boards do not report power
                power += nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        return SystemSample(
            t=time.time(),
            device=self.device,
            utilization_pct=float(sum(utilization)) / len(utilization),
            memory_used_mb=round(used / 2**20, 2),
            memory_pct=round(100.0 * used / total, 3) if total else 0.0,
            power_w=round(power, 2),
            host_cpu_pct=psutil.cpu_percent(interval=None),
        )

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _visible_gpu_indices(count: int) -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    numeric = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return [i for i in numeric if i < count] or list(range(count))


def gpu_count() -> int:
    """GPUs NVML sees on this node (0 without a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver or no device all mean "no GPU"
        return 0


def open_sampler(use_gpu: bool | None = None) -> Sampler:
    """NVML when this node has GPUs (or `use_gpu` says so), psutil otherwise."""
    if use_gpu is None:
        use_gpu = gpu_count() > 0
    return NvmlSampler() if use_gpu else CpuSampler()
