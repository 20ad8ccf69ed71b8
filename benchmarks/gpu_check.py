"""The worker on CUDA GPUs (nccl): DDP and FSDP train, checkpoint, are preempted and resume.

Prints `name: value` lines. Needs at least one CUDA GPU; run it on a GPU machine:
    python benchmarks/gpu_check.py
"""

from __future__ import annotations

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
from training_platform.spec import parse_spec  # noqa: E402


def main() -> None:
    gpus = torch.cuda.device_count()
    print(f"gpus: {gpus} ({torch.cuda.get_device_name(0) if gpus else 'none'})")
    if not gpus:
        return
    home = Path(tempfile.mkdtemp(prefix="tp-gpu-"))
    snapshot = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
    for strategy in ("ddp", "fsdp"):
        spec = parse_spec(
            {
                "name": f"gpu-{strategy}",
                "team": "qa",
                "owner": "ci",
                "strategy": strategy,
                "dataset": {"snapshot_id": snapshot},
                "resources": {"procs_per_node": gpus, "gpus_per_node": gpus},
                "training": {"max_steps": 600, "batch_size": 32, "eval_every": 200, "log_every": 20},
                "checkpoint": {"every_steps": 200, "store_uri": str(home / "checkpoints")},
            }
        )
        started = time.monotonic()
        straight = train(home, f"{strategy}-straight", spec, LocalLauncher())
        print(f"{strategy}_device: {straight['device']}")
        print(f"{strategy}_seconds: {time.monotonic() - started:.1f}")
        print(f"{strategy}_val_accuracy: {straight['metrics'].get('val_accuracy', float('nan')):.4f}")
        again = train(home, f"{strategy}-again", spec, LocalLauncher())
        print(f"{strategy}_deterministic: {again['final_weights_sha256'] == straight['final_weights_sha256']}")
        launcher = LocalLauncher()
        handle = launch(home, f"{strategy}-preempted", spec, launcher)
        wait_for_step(home, f"{strategy}-preempted", 100)
        os.killpg(job_pid(handle), signal.SIGTERM)
        print(f"{strategy}_preempted: {wait(launcher, handle).state == JobState.PREEMPTED}")
        resumed = train(home, f"{strategy}-preempted", spec, LocalLauncher())
        print(f"{strategy}_resumed_from_step: {resumed['resumed_from_step']}")
        print(f"{strategy}_resume_exact: {resumed['final_weights_sha256'] == straight['final_weights_sha256']}")


if __name__ == "__main__":
    main()
