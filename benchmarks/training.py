"""Training benchmark: the platform against bare PyTorch, side by side, in one run.

Prints one ``name: value`` line per figure (definitions and targets: issue 6), then the
measurements behind them as ``detail_*`` lines. Each comparison alternates its two sides
``--repeats`` times and reports medians: this machine's CPUs are shared and noisy (the speed of
the same bare run drifts by several percent over minutes; ``detail_paired_overhead_ratios``
shows each repeat's bare / tp pair, taken back to back).

  platform_overhead_ratio  steps/s of a bare torchrun script (same GPT, data, batches, evaluation)
                           / steps/s of the same run through `tp train` (Dagster, MLflow, checkpoints
                           at the default interval); loop time from the first batch to the last step
  data_stall_fraction      time waiting for data / step time, GPT template reading its snapshot through
                           the streaming reader (node cache, 2 prefetch workers), steady state (after
                           WARMUP steps); the same loop on synthetic in-memory batches is the floor
  zero3_memory_ratio       live tensor bytes per rank after a training step (weights, gradients, optimizer
                           states, buffers), DeepSpeed ZeRO-3 / DDP, 2 ranks, max over ranks; both in the
                           standard mixed-precision setup of 16 bytes/param: DDP as under autocast (fp32
                           weights and gradients, Adam), ZeRO-3 with bf16 weights and gradients plus fp32
                           master weights and Adam (ZeRO-3 in plain fp32 keeps 20 bytes/param: detail line)
  startup_seconds          seconds from `tp train` to its first training step, minus the same for the
                           bare script under torchrun

    python benchmarks/training.py               # about 5 minutes on 2 loaded cores
    python benchmarks/training.py --repeats 1   # quicker, noisier
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training_platform.spec import TrainSpec, parse_spec  # noqa: E402

WARMUP = 10
GPT = {"template": "gpt", "size": "tiny", "seq_len": 64}


def gpt_spec(snapshot_id: str, **training) -> TrainSpec:
    body = {
        "name": "bench-gpt",
        "team": "bench",
        "owner": "bench",
        "task": "language-modeling",
        "model": GPT,
        "dataset": {"snapshot_id": snapshot_id},
        "training": {"max_steps": 300, "batch_size": 16, "eval_every": 100, "log_every": 10, **training},
        "resources": {"procs_per_node": 2},
    }
    return parse_spec(body)


# ----- workers (run under torchrun by the sides below) ---------------------------------------------
def bare_worker(spec_path: str, out: str) -> None:
    """Plain PyTorch: the snapshot's tokens in memory, DDP, Adam; the platform's batches and evaluation."""
    import numpy as np
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training_platform.datasets import load_manifest
    from training_platform.datasets.reader import read_split_table
    from training_platform.train.templates import gpt

    spec = parse_spec(json.loads(Path(spec_path).read_text()))
    cfg = spec.training
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(cfg.seed)
    root = Path(os.environ["TP_HOME"]) / "snapshots"
    manifest = load_manifest(root, spec.dataset.snapshot_id)
    columns = manifest.feature_columns[: spec.model.seq_len + 1]

    def tokens(split: str) -> torch.Tensor:
        table = read_split_table(root, manifest, split)
        return torch.from_numpy(np.stack([table.column(c).to_numpy().astype(np.int64) for c in columns], axis=1))

    train, val = tokens("train"), tokens("validation")[: 8 * cfg.batch_size]
    model = gpt.build_model(spec, manifest.num_features, manifest.num_classes)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    per_epoch = len(train) // (cfg.batch_size * world)
    first, started = time.time(), time.perf_counter()
    for step in range(cfg.max_steps):
        epoch, batch = divmod(step, per_epoch)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed + epoch))
        start = (batch * world + rank) * cfg.batch_size
        rows = train[order[start : start + cfg.batch_size]]
        loss = gpt.loss_fn(ddp(rows[:, :-1]), rows[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % cfg.log_every == 0:
            loss.item()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
            with torch.no_grad():
                model.eval()
                [gpt.loss_fn(model(b[:, :-1]), b[:, 1:]).item() for b in val.split(cfg.batch_size)]
                model.train()
    seconds = time.perf_counter() - started
    if rank == 0:
        summary = {"steps": cfg.max_steps, "loop_seconds": seconds, "steps_per_s": cfg.max_steps / seconds}
        Path(out).write_text(json.dumps(summary | {"first_step_unix": first}))
    dist.destroy_process_group()


def memory_worker(strategy: str, out: str) -> None:
    """Live tensor bytes on this rank after two training steps with DDP, FSDP2 or ZeRO-3."""
    import torch.distributed as dist

    from training_platform.train.strategies.deepspeed import deepspeed_config
    from training_platform.train.templates import gpt

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = parse_spec(
        {
            "name": "mem",
            "team": "bench",
            "owner": "bench",
            "model": {"template": "gpt", "size": "base", "seq_len": 64},
            "strategy": "deepspeed",
            "deepspeed": {"zero_stage": 3},
            "training": {"batch_size": 2},
        }
    )
    model = gpt.build_model(spec, 65, 128)
    if strategy.startswith("zero3"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        torch.utils.deterministic.fill_uninitialized_memory = False
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        config = deepspeed_config(spec, sum(p.numel() for p in model.parameters()))
        if strategy == "zero3-bf16":  # mixed precision: bf16 weights and gradients, fp32 master weights and Adam
            config["bf16"] = {"enabled": True}
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        forward, backward = engine, lambda loss: (engine.backward(loss), engine.step())
    else:
        if strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
        else:
            from torch.nn.parallel import DistributedDataParallel

            wrapped = DistributedDataParallel(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        forward = wrapped

        def backward(loss):
            optimizer.zero_grad(set_to_none=False)  # keep gradients allocated, as between steps
            loss.backward()
            optimizer.step()

    rows = torch.randint(0, 128, (2, 65))
    for _ in range(2):
        backward(gpt.loss_fn(forward(rows[:, :-1]), rows[:, 1:]))
    del rows
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj  # DTensor: this rank's shard
            storage = local.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    total = sum(storages.values())
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, total)
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in gpt.build_model(spec, 65, 128).parameters())
        Path(out).write_text(json.dumps({"bytes_per_rank": gathered, "params": params}))
    # Leave without tearing the process group and DeepSpeed down: seen once in a benchmark run, a
    # ZeRO-3 rank aborted at teardown ("terminate called without an active exception") after the
    # figures were written, and torchrun failed the whole benchmark for it.
    dist.barrier()
    os._exit(0)


# ----- the sides ----------------------------------------------------------------------------------
def torchrun(env: dict, *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", __file__, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def bare_side(home: Path, env: dict, spec: TrainSpec, index: int) -> tuple[dict, float]:
    spec_path, out = home / f"bare-{index}.json", home / f"bare-{index}.out.json"
    spec_path.write_text(spec.model_dump_json())
    launched = time.time()
    torchrun(env, "--worker", "bare", str(spec_path), str(out))
    summary = json.loads(out.read_text())
    return summary, summary["first_step_unix"] - launched


def platform_side(home: Path, env: dict, spec: TrainSpec, index: int) -> tuple[dict, float, str]:
    spec_path = home / f"tp-{index}.yaml"
    spec_path.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    launched = time.time()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("tp")), "train", str(spec_path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=home,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"tp train printed no result:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    loop = home / "runs" / result["run_id"] / "loop.json"
    if not loop.is_file():
        raise RuntimeError(f"tp train did not train: {result}")
    summary = json.loads(loop.read_text())
    status = result.get("status", "?")
    return (
        summary,
        summary["first_step_unix"] - launched,
        status + (f" ({result['error']})" if "error" in result else ""),
    )


def stall_side(home: Path, streaming: bool, steps: int) -> dict:
    """One process: the GPT step on streamed snapshot batches or on synthetic in-memory ones."""
    from training_platform.datasets import load_manifest
    from training_platform.datasets.cache import ShardCache
    from training_platform.datasets.stream import StepBatches, StreamPlan, batch_loader
    from training_platform.train.meter import StepMeter
    from training_platform.train.templates import gpt

    snapshot_id = next(p.stem for p in (home / "snapshots").glob("*.json"))
    spec = gpt_spec(snapshot_id)
    manifest = load_manifest(home / "snapshots", snapshot_id)
    torch.manual_seed(0)
    model = gpt.build_model(spec, manifest.num_features, manifest.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch, length = spec.training.batch_size, spec.model.seq_len + 1
    if streaming:
        rows = tuple(ref.rows for ref in manifest.splits["train"])
        plan = StreamPlan(rows, batch, 0, 1, 0)
        columns = manifest.feature_columns[:length]
        dataset = StepBatches(
            home / "snapshots", manifest, "train", plan, columns=columns, cache=ShardCache(home / "shard-cache")
        )
        source = iter(batch_loader(dataset, 0, steps, workers=2))
    else:
        source = iter(torch.randint(0, manifest.num_classes, (steps, batch, length)))
    meter = StepMeter(batch, spec.model.seq_len)
    for step in range(steps):
        if step == WARMUP:
            meter = StepMeter(batch, spec.model.seq_len)
        with meter.waiting_for_data():
            data = next(source)
        loss = gpt.loss_fn(model(data[:, :-1]), data[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        meter.step_done()
    return meter.summary()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="training steps per overhead run")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        {"bare": bare_worker, "memory": memory_worker}[args.worker[0]](*args.worker[1:])
        return

    from training_platform.datasets import build_snapshot

    home = Path(tempfile.mkdtemp(prefix="tp-bench-training-"))
    env = {**os.environ, "TP_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "PYTHONPATH": str(ROOT)}
    snapshot_id = build_snapshot("python_stdlib_text", home / "snapshots").snapshot_id

    bare, tp, bare_start, tp_start, statuses = [], [], [], [], []
    for index in range(args.repeats):  # alternate the sides
        # A seed per repeat: a run that re-saved the bytes of an earlier one would find all of its
        # checkpoint deduplicated, a case of its own (reproductions), not the one measured here.
        spec = gpt_spec(snapshot_id, max_steps=args.steps, seed=index)
        summary, startup = bare_side(home, env, spec, index)
        bare.append(summary["steps_per_s"])
        bare_start.append(startup)
        summary, startup, status = platform_side(home, env, spec, index)
        tp.append(summary["steps_per_s"])
        tp_start.append(startup)
        statuses.append(status)

    stall, floor = [], []
    for _ in range(max(args.repeats, 2) + 1):
        stall.append(stall_side(home, True, 120)["data_wait_fraction"])
        floor.append(stall_side(home, False, 120)["data_wait_fraction"])

    memory = {}
    for strategy in ("ddp", "zero3-bf16", "zero3", "fsdp"):
        out = home / f"memory-{strategy}.json"
        torchrun(env, "--worker", "memory", strategy, str(out))
        memory[strategy] = json.loads(out.read_text())

    print(f"platform_overhead_ratio: {statistics.median(bare) / statistics.median(tp):.3f}")
    print(f"data_stall_fraction: {statistics.median(stall):.4f}")
    ratio = max(memory["zero3-bf16"]["bytes_per_rank"]) / max(memory["ddp"]["bytes_per_rank"])
    print(f"zero3_memory_ratio: {ratio:.3f}")
    print(f"startup_seconds: {statistics.median(tp_start) - statistics.median(bare_start):.1f}")
    print(f"detail_bare_steps_per_s: {[round(v, 2) for v in bare]}")
    print(f"detail_tp_train_steps_per_s: {[round(v, 2) for v in tp]}")
    print(f"detail_paired_overhead_ratios: {[round(b / t, 3) for b, t in zip(bare, tp, strict=True)]}")
    print(f"detail_tp_train_status: {statuses}")
    print(f"detail_bare_startup_s: {[round(v, 1) for v in bare_start]}")
    print(f"detail_tp_train_startup_s: {[round(v, 1) for v in tp_start]}")
    print(f"detail_stall_streaming: {[round(v, 4) for v in stall]}")
    print(f"detail_stall_synthetic_floor: {[round(v, 4) for v in floor]}")
    for name in ("zero3", "fsdp"):
        fp32_ratio = max(memory[name]["bytes_per_rank"]) / max(memory["ddp"]["bytes_per_rank"])
        print(f"detail_{name}_fp32_memory_ratio: {fp32_ratio:.3f}")
    print(f"detail_memory_bytes_per_rank: { {k: v['bytes_per_rank'] for k, v in memory.items()} }")
    print(f"detail_memory_params: {memory['ddp']['params']}")
    print(f"detail_cpu_count: {os.cpu_count()}")


if __name__ == "__main__":
    main()
