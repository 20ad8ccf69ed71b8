"""The worker on CUDA GPUs (nccl): DDP, FSDP and DeepSpeed train, save in the background, are preempted and resume.

For each strategy, with every GPU of the machine as a rank (one rank per GPU: NCCL takes no two on one):
trained straight, trained again (deterministic: the same final weights), preempted (SIGTERM) past its first
periodic save and resumed (from that step, with bitwise the straight run's final weights: exact resume). The
periodic saves are asynchronous (checkpoint.async_save, the default), so the exact resume also checks the
background path on the GPU.

Prints `name: value` lines. Needs a CUDA GPU; `--cpu` runs the same checks on 2 CPU ranks (gloo), to try the
script and its environment before a GPU machine's time is spent on it:
    python benchmarks/gpu_check.py [--strategies ddp fsdp deepspeed] [--steps 600] [--cpu]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.worker import job_pid, launch, train, wait, wait_for_step  # noqa: E402
from training_platform.datasets import build_snapshot  # noqa: E402
from training_platform.launch import JobState  # noqa: E402
from training_platform.launch.local import LocalLauncher  # noqa: E402
from training_platform.spec import STRATEGIES, parse_spec  # noqa: E402
from training_platform.telemetry.figures import SLOW_DATA_ENV  # noqa: E402

CPU_RANKS = 2
# The preempted run's steps take at least this long (a slow data loader, as drills make one), so the SIGTERM lands
# while it trains: a small model on a GPU trains its 600 steps in about a second.
PREEMPTED_STEP_SECONDS = 0.01


def check(strategy: str, home: Path, snapshot: str, steps: int, gpus: int) -> None:
    """Print the strategy's lines (see the module's docstring)."""
    save_every = steps // 3
    spec = parse_spec(
        {
            "name": f"gpu-{strategy}",
            "team": "qa",
            "owner": "ci",
            "strategy": strategy,
            "dataset": {"snapshot_id": snapshot},
            "resources": {"procs_per_node": gpus or CPU_RANKS, "gpus_per_node": gpus},
            "training": {"max_steps": steps, "batch_size": 32, "eval_every": save_every, "log_every": 20},
            "checkpoint": {"every_steps": save_every, "store_uri": str(home / "checkpoints")},
        }
    )
    started = time.monotonic()
    straight = train(home, f"{strategy}-straight", spec, LocalLauncher(visible_gpus=gpus))
    print(f"{strategy}_device: {straight['device']}")
    print(f"{strategy}_seconds: {time.monotonic() - started:.1f}")
    print(f"{strategy}_val_accuracy: {straight['metrics'].get('val_accuracy', float('nan')):.4f}")
    again = train(home, f"{strategy}-again", spec, LocalLauncher(visible_gpus=gpus))
    print(f"{strategy}_deterministic: {again['final_weights_sha256'] == straight['final_weights_sha256']}")
    launcher = LocalLauncher(visible_gpus=gpus)
    os.environ[SLOW_DATA_ENV] = str(PREEMPTED_STEP_SECONDS)  # the job's environment is taken at its launch
    try:
        handle = launch(home, f"{strategy}-preempted", spec, launcher)
    finally:
        del os.environ[SLOW_DATA_ENV]
    wait_for_step(home, f"{strategy}-preempted", save_every + save_every // 2)
    os.killpg(job_pid(handle), signal.SIGTERM)
    print(f"{strategy}_preempted: {wait(launcher, handle).state == JobState.PREEMPTED}")
    resumed = train(home, f"{strategy}-preempted", spec, LocalLauncher(visible_gpus=gpus))
    print(f"{strategy}_resumed_from_step: {resumed['resumed_from_step']}")
    print(f"{strategy}_resume_exact: {resumed['final_weights_sha256'] == straight['final_weights_sha256']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp", "deepspeed"], choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=600, help="steps per run (a periodic save every third)")
    parser.add_argument("--cpu", action="store_true", help=f"the same checks on {CPU_RANKS} CPU ranks (gloo)")
    args = parser.parse_args()
    gpus = 0 if args.cpu else torch.cuda.device_count()
    print(f"gpus: {gpus} ({torch.cuda.get_device_name(0) if gpus else 'none'})", flush=True)
    if not gpus and not args.cpu:
        print("no CUDA GPU here: nothing checked (--cpu runs the checks on the CPU)")
        return
    home = Path(tempfile.mkdtemp(prefix="tp-gpu-"))
    snapshot = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
    for strategy in args.strategies:
        check(strategy, home, snapshot, args.steps, gpus)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
