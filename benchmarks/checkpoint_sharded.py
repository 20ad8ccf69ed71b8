"""The sharded case of benchmarks/checkpoint.py: FSDP on 2 ranks (gloo, CPU), our save against DCP's own.

`measure_sharded` runs this file under torchrun; each rank trains its shard of the benchmark's model, and per
repeat (all ranks in step, times are the slowest rank's):

- the baseline: `torch.distributed.checkpoint.save` to local disk, files fsynced (what a sharded save costs
  without the platform);
- ours, as the FSDP strategy saves, every SAVE_EVERY_STEPS steps: the state's shard copied while the next
  forward and backward run (the loop's stall: starting the copy, and waiting for its end before the optimizer
  step), then written through DCP and the store in the background (strategies/background_save.py, paced)
  while the ranks train on;
- step time while that save runs, against steps with none running.

Rank 0 writes the medians as JSON to OUT.

    torchrun --standalone --nproc-per-node=2 benchmarks/checkpoint_sharded.py OUT WORKDIR SIZE_GB REPEATS
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.checkpoint import HIDDEN, build_model, train_step  # noqa: E402
from training_platform.checkpoints import open_store  # noqa: E402
from training_platform.checkpoints.sharded import save_sharded  # noqa: E402
from training_platform.train.strategies.background_save import BackgroundSaves, ShardStaging  # noqa: E402

RANKS = 2
# Saves at a cadence, as a run saves (the writer paces a save over half the time between saves): FSDP's steps on
# gloo are slow, so fewer steps between saves than the replicated case's (about 25 s at 1 GB here).
SAVE_EVERY_STEPS = 10
CADENCE_SAVES = 2


def measure_sharded(size_gb: float, repeats: int, workdir: Path) -> dict[str, float]:
    """Run the ranks; their figures (see the module's docstring)."""
    out = workdir / "sharded.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
               __file__, str(out), str(workdir / "sharded"), str(size_gb), str(repeats)]
    env = os.environ | {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or RANKS) // RANKS))}
    subprocess.run(command, check=True, timeout=3600, env=env)
    return json.loads(out.read_text())


def _slowest(seconds: float) -> float:
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _any(flag: bool) -> bool:
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _worker(out: Path, workdir: Path, size_gb: float, repeats: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model(size_gb)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(8, HIDDEN)

    store = open_store(workdir / "store")
    staging, background = ShardStaging(), BackgroundSaves()

    def step() -> float:
        start = time.perf_counter()
        train_step(model, optimizer, batch, before_update=staging.ready)
        return time.perf_counter() - start

    for _ in range(3):  # warm up, and create Adam's moments
        step()
    baseline, stalls, background_s, during, without = [], [], [], [], []
    waits: dict[int, float] = {}  # each save's wait for its copy, before the optimizer step
    for rep in range(repeats):
        target = workdir / f"dcp-{rep}"
        dist.barrier()
        start = time.perf_counter()
        dcp.save(_state(model, optimizer), storage_writer=dcp.FileSystemWriter(str(target), sync_files=True))
        baseline.append(_slowest(time.perf_counter() - start))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(target, ignore_errors=True)

    for number in range(CADENCE_SAVES + repeats):
        measured = number >= CADENCE_SAVES  # the first saves warm up and set the cadence
        dist.barrier()
        start = time.perf_counter()
        copy = staging.copy(_state(model, optimizer))
        stall = time.perf_counter() - start

        def save(pacer, copy=copy, number=number, stall=stall):
            staged, waits[number] = staging.copied(copy)
            return save_sharded(
                store, "bench", number + 1, staged,
                process_group=staging.group, stall_seconds=stall + waits[number], pacer=pacer,
            )

        background.submit(number, save, stall)
        saved_at, finished_at = time.perf_counter(), None
        # Every rank takes the same steps (each is a collective) and agrees whether a save runs on any rank.
        for _ in range(SAVE_EVERY_STEPS):
            running = _any(background.in_flight)
            seconds = step()
            still_running = _any(background.in_flight)
            if finished_at is None and not still_running:
                finished_at = time.perf_counter()
            if measured and running and still_running:  # steps that ran entirely during the save
                during.append(_slowest(seconds))
            elif measured and not running:
                without.append(_slowest(seconds))
        finished = background.finished(wait=True)
        assert finished is not None and finished.error is None, finished
        if measured:
            stalls.append(_slowest(stall + waits[number]))
            background_s.append(_slowest((finished_at or time.perf_counter()) - saved_at))
    if rank == 0:
        out.write_text(json.dumps({
            "baseline": statistics.median(baseline),
            "stall": statistics.median(stalls),
            "background": statistics.median(background_s),
            "step_without": statistics.mean(without) if without else float("nan"),
            "step_during": statistics.mean(during) if during else float("nan"),
            "steps_during": len(during),
        }))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
