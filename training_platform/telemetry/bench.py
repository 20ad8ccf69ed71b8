"""`tp doctor --bench`: what to measure before a long run, each figure with a verdict.

- checkpoint write throughput of the configured store, and whether a full checkpoint of the spec
  (weights + optimizer state) can be written within the budget (10 s);
- all-reduce bus bandwidth over a 2-process gloo group (busbw = algbw x 2(n-1)/n, the nccl-tests
  convention, comparable across group sizes);
- data read throughput of a dataset snapshot;
- on GPUs, the interconnect topology (NVLink or a PCIe fallback) from NVML.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from training_platform.spec import TrainSpec

CHECKPOINT_BUDGET_S = 10.0
MAX_PROBE_BYTES = 256 * 2**20  # large enough to see sustained throughput, small enough for a laptop
MIN_PROBE_BYTES = 16 * 2**20
OPTIMIZER_STATE_FACTOR = {"adam": 2, "adamw": 2, "sgd": 0}  # extra tensors per parameter


@dataclass(frozen=True)
class BenchResult:
    name: str
    value: float | None
    unit: str
    ok: bool
    verdict: str

    def to_dict(self) -> dict:
        return asdict(self)


def full_checkpoint_bytes(spec: TrainSpec, num_features: int = 64, num_classes: int = 10) -> int:
    """Bytes of one full checkpoint: float32 weights plus the optimizer's per-parameter state."""
    from training_platform.train.templates import get_template

    model = get_template(spec.model.template).build_model(spec, num_features, num_classes)
    params = sum(p.numel() for p in model.parameters())
    return params * 4 * (1 + OPTIMIZER_STATE_FACTOR.get(spec.training.optimizer, 2))


def checkpoint_write(store_uri: str, checkpoint_bytes: int, budget_s: float = CHECKPOINT_BUDGET_S) -> BenchResult:
    """Write a probe checkpoint through the store's own save path, then remove it."""
    from training_platform.checkpoints import open_store
    from training_platform.checkpoints.layout import chunk_key, manifest_key, pack_index_key, pack_key, run_prefix

    store = open_store(store_uri)
    probe = max(MIN_PROBE_BYTES, min(checkpoint_bytes, MAX_PROBE_BYTES))
    # Random bytes: content addressing must not deduplicate the probe away.
    state = {"probe": torch.randint(-(2**31), 2**31 - 1, (probe // 4,), dtype=torch.int32)}
    run_id = f"doctor-bench-{os.getpid()}"
    started = time.perf_counter()
    manifest, _ = store.save(run_id, 1, state)
    seconds = time.perf_counter() - started
    for chunk in manifest.chunks:
        store.storage.delete(chunk_key(chunk.digest))
    for pack in {chunk.pack for chunk in manifest.chunks if chunk.pack}:  # a save's packs hold only its chunks
        store.storage.delete(pack_index_key(pack))
        store.storage.delete(pack_key(pack))
    store.storage.delete(manifest_key(run_id, 1))
    root = getattr(store.storage, "root", None)
    if isinstance(root, Path):  # a local store keeps the emptied run directory
        shutil.rmtree(root / run_prefix(run_id), ignore_errors=True)
    rate = probe / seconds
    needed = checkpoint_bytes / rate
    ok = needed <= budget_s
    return BenchResult(
        "checkpoint_write",
        round(rate / 1e6, 1),
        "MB/s",
        ok,
        f"{'yes' if ok else 'NO'}: a full checkpoint of this spec ({checkpoint_bytes / 1e6:.1f} MB) takes "
        f"~{needed:.3g} s to write to {store.uri} (budget {budget_s:g} s)"
        + ("" if ok else "; use a faster store, async saving, or sharded checkpoints"),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce_seconds(nbytes: int, iters: int) -> float:
    """Median seconds of an all-reduce of `nbytes` in this process's group, after a warm-up, each started together."""
    import torch.distributed as dist

    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    times = []
    for _ in range(iters):
        dist.barrier()
        begin = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def _allreduce_worker(rank: int, world: int, port: int, nbytes: int, iters: int, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        seconds = allreduce_seconds(nbytes, iters)
        if rank == 0:
            out["seconds"] = seconds
    finally:
        dist.destroy_process_group()


def allreduce_busbw(world: int = 2, nbytes: int = 32 * 2**20, iters: int = 5) -> BenchResult:
    """Bus bandwidth of an all-reduce of `nbytes` over a local gloo group of `world` processes."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_allreduce_worker, args=(world, _free_port(), nbytes, iters, out), nprocs=world, join=True)
        seconds = out["seconds"]
    algbw = nbytes / seconds
    busbw = algbw * 2 * (world - 1) / world
    return BenchResult(
        "allreduce_busbw",
        round(busbw / 1e9, 3),
        "GB/s",
        True,
        f"{nbytes / 2**20:.0f} MiB all-reduce over {world} gloo processes: {seconds * 1e3:.1f} ms, "
        f"algbw {algbw / 1e9:.3f} GB/s, busbw {busbw / 1e9:.3f} GB/s (busbw = algbw x 2(n-1)/n)",
    )


def data_read(snapshot_root: Path | str, snapshot_id: str | None, min_mb_per_s: float = 100.0) -> BenchResult:
    """Read every split of a snapshot (cold-ish: first read) and report MB/s of decoded arrays."""
    from training_platform.datasets import list_snapshots, read_split

    if snapshot_id is None:
        manifests = list_snapshots(snapshot_root)
        if not manifests:
            return BenchResult("data_read", None, "MB/s", False, f"no snapshot in {snapshot_root}; run `tp demo` first")
        snapshot_id = manifests[-1].snapshot_id
    started, total = time.perf_counter(), 0
    for split in ("train", "validation", "test"):
        features, labels = read_split(snapshot_root, snapshot_id, split)
        total += features.nbytes + labels.nbytes
    seconds = time.perf_counter() - started
    rate = total / seconds / 1e6
    # A snapshot read whole in under a second cannot starve the loop, whatever its MB/s (fixed costs dominate).
    ok = rate >= min_mb_per_s or seconds < 1.0
    return BenchResult(
        "data_read",
        round(rate, 1),
        "MB/s",
        ok,
        f"snapshot {snapshot_id[:12]}: {total / 1e6:.2f} MB in {seconds:.3f} s "
        + ("" if ok else f"(below {min_mb_per_s:g} MB/s: cache the snapshot on local disk)"),
    )


def gpu_topology() -> BenchResult:
    """NVLink links between this node's GPUs, or the PCIe fallback, from NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver means no GPU topology to report
        return BenchResult("gpu_topology", None, "", True, f"no GPU (NVML unavailable: {type(exc).__name__})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        lines, nvlinks = [], 0
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            active = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active += int(pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED)
                except pynvml.NVMLError:
                    break
            nvlinks += active
            lines.append(f"GPU{i} {pynvml.nvmlDeviceGetName(handle)}: {active} NVLink(s) active")
        if count < 2:
            verdict = "; ".join(lines) + " (one GPU: no interconnect to check)"
            return BenchResult("gpu_topology", float(nvlinks), "links", True, verdict)
        ok = nvlinks > 0
        fallback = "" if ok else " -> PCIe fallback: multi-GPU all-reduce will be slow; expect lower busbw"
        return BenchResult("gpu_topology", float(nvlinks), "links", ok, "; ".join(lines) + fallback)
    finally:
        pynvml.nvmlShutdown()


def run_bench(spec: TrainSpec, store_uri: str, snapshot_root: Path | str) -> list[BenchResult]:
    results = [checkpoint_write(store_uri, full_checkpoint_bytes(spec))]
    results.append(allreduce_busbw())
    results.append(data_read(snapshot_root, spec.dataset.snapshot_id))
    results.append(gpu_topology())
    return results
