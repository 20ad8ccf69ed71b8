"""Telemetry overhead: the same CPU training-like loop with and without the background sampler.

Side by side in one run, alternating the two sides, medians of several rounds. Prints
`name: value` lines:
  sample_cost_us            median cost of one CpuSampler.sample() call, microseconds
  loop_slowdown_ratio       loop time with the sampler at --interval / loop time without it
  loop_slowdown_ratio_fast  the same with a 10x shorter interval (a stress setting)

Usage: python benchmarks/telemetry_overhead.py [--interval 1.0] [--rounds 7] [--seconds 2.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from training_platform.telemetry.monitor import SystemMonitor  # noqa: E402
from training_platform.telemetry.samplers import CpuSampler  # noqa: E402


def workload(steps: int) -> float:
    """Small matmuls and an optimizer-like update: the shape of the digits loop, on one thread."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    x = torch.randn(64, 256)
    begin = time.perf_counter()
    for _ in range(steps):
        y = torch.relu(x @ w)
        w -= 1e-6 * (x.T @ y)
    return time.perf_counter() - begin


def timed(steps: int, interval: float | None) -> float:
    monitor = SystemMonitor(CpuSampler(), interval_s=interval).start() if interval else None
    try:
        return workload(steps)
    finally:
        if monitor is not None:
            monitor.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="target length of one loop")
    args = parser.parse_args()
    torch.set_num_threads(1)

    sampler = CpuSampler()
    costs = []
    for _ in range(200):
        begin = time.perf_counter()
        sampler.sample()
        costs.append(time.perf_counter() - begin)
    print(f"sample_cost_us: {statistics.median(costs) * 1e6:.1f}")

    per_step = workload(50) / 50
    steps = max(100, int(args.seconds / per_step))
    for name, interval in (("loop_slowdown_ratio", args.interval), ("loop_slowdown_ratio_fast", args.interval / 10)):
        ratios = []
        for i in range(args.rounds):
            # Alternate which side goes first: the machine's load drifts between rounds.
            if i % 2:
                off, on = timed(steps, None), timed(steps, interval)
            else:
                on, off = timed(steps, interval), timed(steps, None)
            ratios.append(on / off)
        print(f"{name}: {statistics.median(ratios):.4f} (interval {interval:g} s, {args.rounds} rounds, {steps} steps)")


if __name__ == "__main__":
    main()
