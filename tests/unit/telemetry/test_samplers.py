"""Samplers return real readings on this machine; the NVML path runs only where a GPU is present."""

import threading
import time

import psutil
import pytest

from training_platform.telemetry.monitor import SystemMonitor
from training_platform.telemetry.samplers import CpuSampler, NvmlSampler, gpu_count, open_sampler


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_sampler_sees_a_busy_process_busy():
    sampler = CpuSampler()
    sampler.sample()
    _burn(0.4)
    busy = sampler.sample()
    assert busy.device == "cpu"
    # Time on a CPU or waiting for one counts as busy, so a spinning process reads high even on a loaded host.
    assert busy.utilization_pct > 70, busy
    assert busy.memory_used_mb > 10
    assert 0 < busy.memory_pct < 100
    assert busy.host_cpu_pct is not None


def test_cpu_sampler_sees_a_sleeping_process_idle():
    sampler = CpuSampler()
    sampler.sample()
    time.sleep(0.4)
    idle = sampler.sample()
    assert idle.utilization_pct < 20, idle


def test_cpu_sampler_measures_several_processes():
    sampler = CpuSampler([psutil.Process(), psutil.Process()])
    sampler.sample()
    _burn(0.2)
    assert sampler.sample().utilization_pct > 50


def test_open_sampler_picks_the_cpu_without_gpus():
    if gpu_count() > 0:
        pytest.skip("this machine has a GPU: open_sampler picks NVML (tested below)")
    assert open_sampler().device == "cpu"


@pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU/driver on this machine: the NVML sampler needs one")
def test_nvml_sampler_reads_the_gpus():
    sampler = NvmlSampler()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    assert sample.device == "gpu"
    assert 0 <= sample.utilization_pct <= 100
    assert sample.memory_used_mb > 0 and 0 < sample.memory_pct <= 100
    assert sample.power_w is not None and sample.power_w > 0
    assert open_sampler().device == "gpu"


def test_monitor_samples_in_the_background_until_stopped():
    seen = threading.Event()
    monitor = SystemMonitor(CpuSampler(), interval_s=0.05, on_sample=lambda s: seen.set())
    with monitor:
        assert seen.wait(5), "no sample within 5 s"
        _burn(0.2)
    samples = monitor.samples
    count = len(samples)
    assert count >= 2
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    time.sleep(0.15)
    assert len(monitor.samples) == count, "the monitor kept sampling after stop()"


def test_monitor_survives_a_failing_sampler():
    class Broken:
        device = "cpu"

        def sample(self):
            raise RuntimeError("sensor gone")

        def close(self):
            pass

    monitor = SystemMonitor(Broken(), interval_s=0.01).start()
    time.sleep(0.1)
    assert monitor.stop() == []
    assert monitor.errors and "sensor gone" in monitor.errors[0]


def test_monitor_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="TP_TELEMETRY_INTERVAL_S"):
        SystemMonitor(CpuSampler(), interval_s=0)
