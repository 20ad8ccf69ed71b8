"""Checkpoint benchmark: our store against the machine's own limits, side by side, in one run.

Prints one ``name: value`` line per figure (see issue 3 for the definitions and targets),
then the measurements behind them as ``detail_*`` lines. Every comparison alternates its two
sides (``--repeats`` times) and reports medians, because disk and page cache are noisy here.

    python benchmarks/checkpoint.py                # >= 1 GB of model + Adam state
    python benchmarks/checkpoint.py --size-gb 0.2  # quick run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training_platform.checkpoints import AsyncCheckpointer, open_store  # noqa: E402

HIDDEN = 2048
# The fine-tune's dedup is measured at --size-gb and at this size too: a small model's layers are small tensors.
SMALL_DEDUP_GB = 0.05
BLOCK = 8 << 20
# The async figures train at a cadence: a save every this many steps (about 16 s of the 1 GB model's steps here).
SAVE_EVERY_STEPS = 40
CADENCE_SAVES = 2


# ----- the workload ------------------------------------------------------------------------------
def build_model(size_gb: float, hidden: int = HIDDEN) -> nn.Sequential:
    """An MLP whose parameters plus Adam's two moments are `size_gb` GB (12 bytes per parameter)."""
    layers = max(2, round(size_gb * 1e9 / 12 / (hidden * hidden + hidden)))
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)])


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, before_update=None) -> None:
    """One step; `before_update` runs right before the optimizer changes the state (a copy of it may be in flight)."""
    loss = model(batch).float().pow(2).mean()
    loss.backward()
    if before_update is not None:
        before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def named_tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """The state's tensors by their path in it."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list | tuple) else ()
    return {path: t for key, value in items for path, t in named_tensors(value, f"{prefix}/{key}").items()}


def state_bytes(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


# ----- baselines: the machine's own limits -------------------------------------------------------
def raw_write(path: Path, nbytes: int, buffer: memoryview) -> float:
    """Seconds to write `nbytes` sequentially and fdatasync (what `dd conv=fdatasync` measures)."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, buffer[: min(left, len(buffer))])
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def raw_read(path: Path, buffer: memoryview) -> float:
    """Seconds to read a file sequentially with large reads (after evicting it from the page cache)."""
    evict(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    return time.perf_counter() - start


def evict(path: Path) -> None:
    """Drop a file's clean pages from the page cache, so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def torch_save_fsync(state, path: Path) -> float:
    start = time.perf_counter()
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - start


# ----- our side ----------------------------------------------------------------------------------
def our_save(state, root: Path) -> float:
    store = open_store(root)
    start = time.perf_counter()
    store.save("bench", 1, state)
    return time.perf_counter() - start


def our_restore(root: Path, into) -> float:
    """A resume: the checkpoint read into the state of a model and optimizer already built (INTO), as `load_state_dict`
    would overwrite them; like the raw read into its reused buffer, it allocates nothing."""
    store = open_store(root)
    for path in root.rglob("*"):  # chunks, packs and manifests
        if path.is_file():
            evict(path)
    start = time.perf_counter()
    restored = store.restore_latest("bench", into=into)
    elapsed = time.perf_counter() - start
    assert restored is not None and not restored.skipped
    return elapsed


def same_shapes(state):
    """A resuming process's own state: the same tensors' shapes, memory of its own, already written."""
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {key: same_shapes(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(same_shapes(value) for value in state)
    return state


def measure_async(model, optimizer, batch, store_root: Path, repeats: int, sync=lambda: None) -> dict[str, float]:
    """Stall of save_async, and step time while the background save runs versus without, training at a cadence:
    a save every SAVE_EVERY_STEPS steps, as a run saves (the writer spreads a save over half the time between
    saves, training/checkpoints/pacing.py; a save still running when the next is due is waited for). The snapshot
    is copied beside the next step's forward and backward, as the DDP strategy saves: the stall is save_async's
    time plus the wait for the copy before the optimizer step."""
    store = open_store(store_root)
    stalls, during, without, background = [], [], [], []
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.reserve(state_of(model, optimizer))
        for _ in range(3):  # warm up the steps
            train_step(model, optimizer, batch)
        for save in range(CADENCE_SAVES + repeats):
            measured = save >= CADENCE_SAVES  # the first saves warm the writer and set the cadence
            checkpointer.save_async("bench", save, state_of(model, optimizer), overlap=True)
            saved_at, finished_at = time.perf_counter(), None
            for _ in range(SAVE_EVERY_STEPS):
                running = checkpointer.in_flight
                start = time.perf_counter()
                train_step(model, optimizer, batch, before_update=checkpointer.ready)
                sync()
                seconds = time.perf_counter() - start
                still_running = checkpointer.in_flight
                if finished_at is None and not still_running:
                    finished_at = time.perf_counter()
                if measured and running and still_running:  # steps that ran entirely during the save
                    during.append(seconds)
                elif measured and not running:
                    without.append(seconds)
            result = checkpointer.wait()
            assert result.ok, result.error
            if measured:
                stalls.append(result.stall_seconds)
                background.append((finished_at or time.perf_counter()) - saved_at)
    return {
        "stall": statistics.median(stalls),
        "step_during": statistics.mean(during) if during else float("nan"),
        "step_without": statistics.mean(without) if without else float("nan"),
        "steps_during": len(during),
        "background": statistics.median(background),
    }


def measure_dedup(size_gb: float, root: Path) -> dict[str, float]:
    """10 checkpoints of a fine-tune with the first 90% of parameters frozen, from a stored base model."""
    # A fine-tune state (weights, Adam moments of the trainable 10%) of `size_gb`; narrow layers,
    # so that "the first 90% of parameters" falls on a layer boundary.
    model = build_model(size_gb * 2.5, hidden=512)
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    frozen = 0
    for p in params:
        if frozen + p.numel() <= 0.9 * total:
            p.requires_grad_(False)
            frozen += p.numel()
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-4)
    store = open_store(root)
    store.lease_settle_seconds = 0.5
    store.save("base-model", 0, {"model": model.state_dict()})  # the pretrained model we start from
    batch = torch.randn(4, 512)
    ours = naive = weights_ours = weights_naive = changed = 0
    previous = {name: t.clone() for name, t in named_tensors({"model": model.state_dict()}).items()}
    for step in range(1, 11):
        train_step(model, optimizer, batch)
        state = state_of(model, optimizer)
        _, stats = store.save("fine-tune", step, state)
        ours += stats.bytes_written
        naive += state_bytes(state)
        # The floor: what any store must write, the bytes of the tensors that differ from the last save's
        # (a trainable layer whose gradient vanished through the frozen ones does not change).
        current = named_tensors(state)
        changed += sum(state_bytes(t) for name, t in current.items()
                       if name not in previous or not torch.equal(t, previous[name]))
        previous = {name: t.clone() for name, t in current.items()}
        # The same fine-tune checkpointing weights only (e.g. for evaluation/export): no Adam moments.
        _, stats = store.save("fine-tune-weights", step, {"model": state["model"]})
        weights_ours += stats.bytes_written
        weights_naive += state_bytes(state["model"])
    return {
        "ratio": ours / naive,
        "floor": changed / naive,
        "frozen_fraction": frozen / total,
        "weights_only_ratio": weights_ours / weights_naive,
    }


def measure_dedups(size_gb: float, workdir: Path) -> dict[float, dict[str, float]]:
    """The fine-tune's dedup at SIZE_GB and at SMALL_DEDUP_GB, whose layers are small tensors."""
    dedups = {}
    for size in sorted({size_gb, SMALL_DEDUP_GB}):
        dedups[size] = measure_dedup(size, workdir / "dedup")
        shutil.rmtree(workdir / "dedup", ignore_errors=True)
    return dedups


def measure_s3(state, nbytes: int, workdir: Path, repeats: int) -> dict[str, float]:
    """Our upload to a loopback S3 server against boto3 upload_file of the same number of bytes."""
    from tests.fixtures.s3 import S3Server

    server = S3Server(workdir / "s3")
    server.start()
    os.environ.update(server.env())
    try:
        import boto3

        bucket = server.new_bucket("bench")
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint_url)
        blob = workdir / "s3-blob.bin"
        raw_write(blob, nbytes, memoryview(os.urandom(BLOCK)))
        ours, plain = [], []
        for rep in range(repeats):
            start = time.perf_counter()
            client.upload_file(str(blob), bucket, f"plain/{rep}.bin")
            plain.append(time.perf_counter() - start)
            store = open_store(f"s3://{bucket}/ours-{rep}")
            start = time.perf_counter()
            store.save("bench", 1, state)
            ours.append(time.perf_counter() - start)
        return {"ours": statistics.median(ours), "plain": statistics.median(plain)}
    finally:
        server.stop()


def measure_cuda(model: nn.Module, batch: torch.Tensor, workdir: Path, repeats: int) -> dict[str, float]:
    """The same model trained on the GPU: snapshot is a device-to-host copy into pinned staging."""
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = batch.cuda()
    train_step(model, optimizer, batch)
    torch.cuda.synchronize()
    saves = [torch_save_fsync(state_of(model, optimizer), workdir / "cuda.pt") for _ in range(repeats)]
    (workdir / "cuda.pt").unlink()
    timing = measure_async(model, optimizer, batch, workdir / "cuda-async", repeats, sync=torch.cuda.synchronize)
    shutil.rmtree(workdir / "cuda-async", ignore_errors=True)
    return {
        "stall_ratio": timing["stall"] / statistics.median(saves),
        "step_slowdown_during_save": timing["step_during"] / timing["step_without"],
        "stall_s": timing["stall"],
        "background_s": timing["background"],
    }


def print_cuda(cuda: dict[str, float]) -> None:
    """The GPU case's figures: its stall against torch.save of the same state, steps during a save against without."""
    print(f"cuda_stall_ratio: {cuda['stall_ratio']:.3f}")
    print(f"cuda_step_slowdown_during_save: {cuda['step_slowdown_during_save']:.3f}")
    for key in ("stall_s", "background_s"):
        print(f"detail_cuda_{key}: {cuda[key]:.3f}")


# ----- the run -----------------------------------------------------------------------------------
def print_sharded(sharded: dict[str, float]) -> None:
    """The FSDP case's figures: stall against DCP's own synchronous save, steps during a save against without."""
    print(f"stall_ratio_sharded: {sharded['stall'] / sharded['baseline']:.3f}")
    print(f"step_slowdown_during_save_sharded: {sharded['step_during'] / sharded['step_without']:.3f}")
    for key, value in sharded.items():
        print(f"detail_sharded_{key}: {value:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="model + Adam state size (default 1.0)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations per comparison")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--skip-s3", action="store_true", help="leave out the S3 figure")
    parser.add_argument("--s3-only", action="store_true", help="measure only the S3 figure")
    parser.add_argument("--dedup-only", action="store_true", help="measure only the fine-tune's dedup figures")
    parser.add_argument("--skip-sharded", action="store_true", help="leave out the FSDP (2 ranks) figures")
    parser.add_argument("--sharded-only", action="store_true", help="measure only the FSDP (2 ranks) figures")
    parser.add_argument(
        "--cuda", action="store_true", help="also measure stall and step slowdown with the model on the GPU"
    )
    parser.add_argument("--cuda-only", action="store_true", help="measure only the GPU's stall and step slowdown")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tp-ckpt-bench-", dir=args.dir))
    try:
        from benchmarks.checkpoint_sharded import measure_sharded  # it imports this module's workload

        if args.sharded_only:
            print_sharded(measure_sharded(args.size_gb, args.repeats, workdir))
            return
        if args.dedup_only:
            for size_gb, figures in measure_dedups(args.size_gb, workdir).items():
                print(f"dedup_over_floor_{size_gb:g}gb: {figures['ratio'] / figures['floor']:.3f}")
                print(f"detail_dedup_bytes_ratio_{size_gb:g}gb: {figures['ratio']:.3f}")
                print(f"detail_dedup_changed_bytes_floor_{size_gb:g}gb: {figures['floor']:.3f}")
            return
        model = build_model(args.size_gb)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        batch = torch.randn(8, HIDDEN)
        train_step(model, optimizer, batch)  # creates the Adam moments
        state = state_of(model, optimizer)
        nbytes = state_bytes(state)
        print(f"detail_state_bytes: {nbytes}", flush=True)
        if args.cuda_only:
            print_cuda(measure_cuda(model, batch, workdir, args.repeats))
            return
        if args.s3_only:
            s3 = measure_s3(state, nbytes, workdir, max(2, args.repeats - 1))
            print(f"s3_upload_ratio: {s3['plain'] / s3['ours']:.3f}")
            print(f"detail_s3_plain_upload_MBps: {nbytes / 1e6 / s3['plain']:.0f}")
            print(f"detail_s3_ours_upload_MBps: {nbytes / 1e6 / s3['ours']:.0f}")
            return

        # Write: raw disk, torch.save + fsync, ours, alternating; every save to a fresh place.
        buffer = memoryview(os.urandom(BLOCK))
        raw_w, torch_w, ours_w = [], [], []
        for _ in range(args.repeats):
            raw_w.append(raw_write(workdir / "raw.bin", nbytes, buffer))
            torch_w.append(torch_save_fsync(state, workdir / "torch.pt"))
            shutil.rmtree(workdir / "ours", ignore_errors=True)
            ours_w.append(our_save(state, workdir / "ours"))
            (workdir / "torch.pt").unlink()
        raw_write_s, torch_s, ours_s = (statistics.median(x) for x in (raw_w, torch_w, ours_w))

        # Read: raw sequential read of a file this size, our verified restore; both from the disk.
        raw_r, ours_r = [], []
        read_buffer = memoryview(bytearray(BLOCK))
        resumed = same_shapes(state)
        for _ in range(args.repeats):
            raw_r.append(raw_read(workdir / "raw.bin", read_buffer))
            ours_r.append(our_restore(workdir / "ours", into=resumed))
        restored = named_tensors(resumed)
        assert all(torch.equal(t, restored[name]) for name, t in named_tensors(state).items()), "restore is not exact"
        del restored
        del resumed
        raw_read_s, restore_s = statistics.median(raw_r), statistics.median(ours_r)
        shutil.rmtree(workdir / "ours", ignore_errors=True)

        timing = measure_async(model, optimizer, batch, workdir / "async", args.repeats)
        shutil.rmtree(workdir / "async", ignore_errors=True)
        dedups = measure_dedups(args.size_gb, workdir)
        dedup = dedups[args.size_gb]
        s3 = None if args.skip_s3 else measure_s3(state, nbytes, workdir, max(2, args.repeats - 1))
        cuda = measure_cuda(model, batch, workdir, args.repeats) if args.cuda else None
        sharded = None if args.skip_sharded else measure_sharded(args.size_gb, args.repeats, workdir)

        print(f"stall_ratio: {timing['stall'] / torch_s:.3f}")
        print(f"write_throughput_ratio: {raw_write_s / ours_s:.3f}")
        print(f"step_slowdown_during_save: {timing['step_during'] / timing['step_without']:.3f}")
        if sharded is not None:
            print_sharded(sharded)
        print(f"dedup_bytes_ratio: {dedup['ratio']:.3f}")
        for size_gb, figures in dedups.items():  # the distance to what must be written: the changed bytes
            print(f"dedup_over_floor_{size_gb:g}gb: {figures['ratio'] / figures['floor']:.3f}")
        print(f"restore_throughput_ratio: {raw_read_s / restore_s:.3f}")
        if s3 is not None:
            print(f"s3_upload_ratio: {s3['plain'] / s3['ours']:.3f}")
        mb = nbytes / 1e6
        print(f"detail_raw_write_MBps: {mb / raw_write_s:.0f}")
        print(f"detail_ours_write_MBps: {mb / ours_s:.0f}")
        print(f"detail_torch_save_fsync_MBps: {mb / torch_s:.0f}")
        print(f"detail_torch_save_fsync_s: {torch_s:.3f}")
        print(f"detail_async_stall_s: {timing['stall']:.3f}")
        print(f"detail_async_background_s: {timing['background']:.3f}")
        print(f"detail_step_s_without_save: {timing['step_without']:.3f}")
        print(f"detail_step_s_during_save: {timing['step_during']:.3f} ({timing['steps_during']} steps)")
        print(f"detail_save_every_steps: {SAVE_EVERY_STEPS}")
        print(f"detail_dedup_changed_bytes_floor: {dedup['floor']:.3f}")
        print(f"detail_dedup_frozen_fraction: {dedup['frozen_fraction']:.3f}")
        print(f"detail_dedup_weights_only_ratio: {dedup['weights_only_ratio']:.3f}")
        print(f"detail_raw_read_MBps: {mb / raw_read_s:.0f}")
        print(f"detail_restore_MBps: {mb / restore_s:.0f}")
        if cuda is not None:
            print_cuda(cuda)
        if s3 is not None:
            print(f"detail_s3_plain_upload_MBps: {mb / s3['plain']:.0f}")
            print(f"detail_s3_ours_upload_MBps: {mb / s3['ours']:.0f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
