"""Preemption benchmark: the same run uninterrupted and SIGTERM-preempted every N seconds, side by side.

A spot run on the local launcher (spot runs keep a warm standby: launch/standby.py), 2 ranks, digits.
Prints `name: value` lines:
  goodput                   wall time uninterrupted / wall time preempted (resubmitted at once, as a requeue)
  lost_steps_per_preemption steps redone after each preemption (SIGTERM with a grace period)
  recovery_seconds          median from the signal to the first resumed training step
  weights_equal             whether the runs ended with bitwise the same weights
  detail_cold_*             the same pair with the standby off (resources.spot: false): cold requeues
With --backend slurm (a real local cluster, deploy/slurm/local-cluster.sh; root), the pair on Slurm, each
preemption an on-demand job taking the spot run's CPUs, the run requeued by Slurm:
  slurm_goodput             wall time uninterrupted / wall time preempted every --slurm-interval seconds
  slurm_recovery_seconds    median from the emergency checkpoint to the first step of the requeued attempt
  slurm_weights_equal       whether both Slurm runs ended with bitwise the same weights

Usage: python benchmarks/preemption.py [--interval 20] [--steps 20000]   # about 4 minutes here
       python benchmarks/preemption.py --backend slurm [--slurm-interval 120]   # about 12 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.worker import job_pid, launch  # noqa: E402
from training_platform.datasets import build_snapshot  # noqa: E402
from training_platform.launch import JobState  # noqa: E402
from training_platform.launch.local import LocalLauncher  # noqa: E402
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher  # noqa: E402
from training_platform.recovery.preemption import summarize  # noqa: E402
from training_platform.recovery.requeue import follow_requeued  # noqa: E402
from training_platform.runs.events import RunEvents  # noqa: E402
from training_platform.spec import parse_spec  # noqa: E402


def run(home: Path, run_id: str, spec, interval: float | None) -> tuple[float, int]:
    """Wall seconds until the run succeeds, resubmitting after each preemption; and the preemption count."""
    launcher = LocalLauncher(visible_gpus=0)
    started = time.monotonic()
    preemptions = 0
    while True:
        handle = launch(home, run_id, spec, launcher)
        attempt_started, signalled = time.monotonic(), False
        # Polled finely: the requeue follows the job's end at once, as an engine's requeue would.
        while not (status := launcher.status(handle)).state.finished and status.state != JobState.PREEMPTED:
            if interval is not None and not signalled and time.monotonic() - attempt_started >= interval:
                os.killpg(job_pid(handle), signal.SIGTERM)
                signalled = True
            time.sleep(0.01)
        if status.state == JobState.SUCCEEDED:
            return time.monotonic() - started, preemptions
        if status.state != JobState.PREEMPTED:
            raise RuntimeError(f"{run_id} ended {status.state}: {launcher.logs(handle)[-2000:]}")
        preemptions += 1


def run_slurm(home: Path, run_id: str, spec, interval: float | None, slurm_conf: str) -> float:
    """Wall seconds until the Slurm job succeeds, an on-demand job preempting it every `interval` seconds.

    Slurm requeues the job itself; once a second, as the platform's asset does, the job is polled and a
    requeued one released from Slurm's hold once its emergency checkpoint is written (requeue.py)."""
    launcher = SlurmLauncher(SlurmConfig(slurm_conf=slurm_conf))
    handle = launch(home, run_id, spec, launcher)
    started = last_preemption = time.monotonic()
    while not (status := launcher.status(handle)).state.finished:
        follow_requeued(launcher, handle, spec, home / "runs" / run_id, status)
        if interval is not None and status.state is JobState.RUNNING and time.monotonic() - last_preemption >= interval:
            subprocess.run(
                ["sbatch", "--parsable", "--partition=ondemand", "--ntasks=1", "--output=/dev/null", "--wrap=sleep 1"],
                check=True,
                capture_output=True,
                env={**os.environ, "SLURM_CONF": slurm_conf},
            )
            last_preemption = time.monotonic()
        time.sleep(1.0)
    if status.state != JobState.SUCCEEDED:
        raise RuntimeError(f"{run_id} ended {status.state}: {launcher.logs(handle)[-2000:]}")
    return time.monotonic() - started


def slurm_pair(home: Path, spec, interval: float) -> None:
    """The same spot run on the local Slurm cluster, uninterrupted and preempted; the cluster is stopped
    afterwards only when this benchmark started it."""
    script = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "local-cluster.sh"
    status = subprocess.run(["bash", str(script), "status"], capture_output=True, text=True)
    was_running = "slurmctld: running" in status.stdout
    subprocess.run(["bash", str(script), "up"], check=True, capture_output=True)
    slurm_conf = f"{os.environ.get('TP_SLURM_DIR', '/tmp/tp-slurm')}/etc/slurm.conf"
    try:
        spot = spec.model_copy(update={"resources": spec.resources.model_copy(update={"procs_per_node": 2})})
        straight = run_slurm(home, "slurm-straight", spot, None, slurm_conf)
        preempted = run_slurm(home, "slurm-preempted", spot, interval, slurm_conf)
    finally:
        if not was_running:
            subprocess.run(["bash", str(script), "down"], capture_output=True)
    summary = summarize(RunEvents(home / "runs" / "slurm-preempted").read())
    weights = {
        json.loads((home / "runs" / name / "result.json").read_text())["final_weights_sha256"]
        for name in ("slurm-straight", "slurm-preempted")
    }
    print(f"slurm_uninterrupted_seconds: {straight:.1f}")
    print(f"slurm_preempted_seconds: {preempted:.1f}")
    print(f"slurm_preemptions: {summary.preemptions}")
    print(f"slurm_goodput: {straight / preempted:.3f}")
    print(f"slurm_lost_steps: {summary.lost_steps}")
    print(f"slurm_recovery_seconds: {_median(summary.recovery_seconds):.2f}")
    print(f"slurm_recovery_seconds_each: {summary.recovery_seconds}")
    print(f"slurm_weights_equal: {len(weights) == 1}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["local", "slurm"], default="local")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between preemptions")
    parser.add_argument("--steps", type=int, default=20000, help="training steps of the run (several intervals long)")
    parser.add_argument("--slurm-interval", type=float, default=120.0, help="seconds between Slurm preemptions")
    parser.add_argument("--slurm-steps", type=int, default=150000, help="training steps of each Slurm run")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tp-bench-preemption-"))
    snapshot = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
    steps = args.slurm_steps if args.backend == "slurm" else args.steps
    spec = parse_spec(
        {
            "name": "bench",
            "team": "bench",
            "owner": "bench",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": steps, "batch_size": 32, "eval_every": 2000, "log_every": 100},
            "resources": {"spot": True},  # as runs on spot capacity are: requeues start from a warm standby
            "checkpoint": {"every_steps": 2000, "keep_last": 2, "store_uri": str(home / "checkpoints")},
        }
    )
    if args.backend == "slurm":
        slurm_pair(home, spec, args.slurm_interval)
        return
    straight_seconds, _ = run(home, "straight", spec, None)
    preempted_seconds, preemptions = run(home, "preempted", spec, args.interval)
    summary = summarize(RunEvents(home / "runs" / "preempted").read())
    lost = [i.lost_steps for i in summary.interruptions if i.lost_steps is not None]
    # The same pair without the standby (resources.spot off): every requeue starts cold.
    cold = spec.model_copy(update={"resources": spec.resources.model_copy(update={"spot": False})})
    cold_straight_seconds, _ = run(home, "cold-straight", cold, None)
    cold_preempted_seconds, _ = run(home, "cold-preempted", cold, args.interval)
    cold_summary = summarize(RunEvents(home / "runs" / "cold-preempted").read())
    weights = {
        name: json.loads((home / "runs" / name / "result.json").read_text())["final_weights_sha256"]
        for name in ("straight", "preempted", "cold-preempted")
    }
    print(f"uninterrupted_seconds: {straight_seconds:.1f}")
    print(f"preempted_seconds: {preempted_seconds:.1f}")
    print(f"preemptions: {preemptions}")
    print(f"goodput: {straight_seconds / preempted_seconds:.3f}")
    print(f"lost_steps_per_preemption: {statistics.mean(lost) if lost else 0:.2f}")
    print(f"recovery_seconds: {_median(summary.recovery_seconds):.2f}")
    print(f"weights_equal: {len(set(weights.values())) == 1}")
    print(f"detail_cold_goodput: {cold_straight_seconds / cold_preempted_seconds:.3f}")
    print(f"detail_cold_recovery_seconds: {_median(cold_summary.recovery_seconds):.2f}")
    print(f"detail_cold_seconds: [{cold_straight_seconds:.1f}, {cold_preempted_seconds:.1f}]")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


if __name__ == "__main__":
    main()
