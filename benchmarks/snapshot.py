"""Snapshot benchmark: a snapshot of a team's own Parquet files against pyarrow's own read and write of them.

Writes --gb of Parquet (random float features, an integer label, a string key; --files part files) to a
temporary directory, then, in one run:

  snapshot_throughput_ratio     pyarrow reading the files and writing them back as one zstd Parquet file, over
                                build_file_snapshot of the same files (a first build: read, hash, split by key,
                                shard, hash and write each shard durably, publish the manifest); > 1 means the
                                snapshot is faster (target >= 0.7). Medians of --repeats pairs, side by side.
  unchanged_resnapshot_ratio    a second build of the unchanged files over the first (target <= 0.05).

  loader_stall_fraction         time the GPT template's training step waits for its next batch / the step's time,
                                fed by the worker SDK's streamed dataset (`session.dataset("train", stream=True)`:
                                shards through the node cache, prefetch workers as the platform picks them for one
                                rank here) on the standard library's text snapshot, after WARMUP steps (target
                                <= 0.02); the same loop on synthetic in-memory batches is the floor (detail line).

    python benchmarks/snapshot.py              # 1 GB: a few minutes on 2 cores
    python benchmarks/snapshot.py --gb 0.1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from training_platform.datasets.files import FileSource, build_file_snapshot  # noqa: E402
from training_platform.spec.file_source import FileColumns, FileSplit  # noqa: E402

FEATURES = 16
WARMUP = 10  # steps before the loader stall is measured: the workers start, the first shards decode


def write_files(folder: Path, gb: float, files: int) -> int:
    """Random rows in `files` Parquet files of about `gb` GB in all (float64 compresses barely); returns rows."""
    folder.mkdir(parents=True)
    rows = int(gb * 1e9 / (8 * FEATURES + 8 + 12))
    rng = np.random.default_rng(0)
    for index, part in enumerate(np.array_split(np.arange(rows), files)):
        columns = {f"f{i}": rng.standard_normal(len(part)) for i in range(FEATURES)}
        columns["label"] = rng.integers(0, 10, len(part))
        columns["user"] = pa.array([f"u{n:09d}" for n in part])
        pq.write_table(pa.table(columns), folder / f"part-{index:03d}.parquet", compression="zstd")
    return rows


def baseline(folder: Path, out: Path) -> float:
    """pyarrow's own: read every file, write the rows back as one Parquet file."""
    started = time.perf_counter()
    table = pq.read_table(folder)
    pq.write_table(table, out, compression="zstd", compression_level=3)
    return time.perf_counter() - started


def timed_build(source: FileSource, root: Path) -> tuple[float, bool]:
    started = time.perf_counter()
    built = build_file_snapshot(source, root)
    return time.perf_counter() - started, built.parsed


def loader_stall(work: Path, steps: int) -> tuple[float, float, int]:
    """(data wait fraction streamed, the same on synthetic batches, prefetch workers)."""
    import torch

    from training_platform.datasets import build_snapshot
    from training_platform.spec import parse_spec
    from training_platform.train.meter import StepMeter
    from training_platform.train.split_data import SplitStream, prefetch_workers
    from training_platform.train.templates import gpt

    root = work / "text-snapshots"
    manifest = build_snapshot("python_stdlib_text", root)
    spec = parse_spec(
        {
            "name": "bench-loader",
            "team": "bench",
            "owner": "bench",
            "model": {"template": "gpt", "size": "tiny", "seq_len": 64},
            "dataset": {"snapshot_id": manifest.snapshot_id},
            "training": {"max_steps": steps, "batch_size": 16},
            "resources": {"procs_per_node": 1},
        }
    )
    columns = manifest.feature_columns[: spec.model.seq_len + 1]
    workers = prefetch_workers(spec.resources.procs_per_node)
    fractions = []
    for streamed in (True, False):
        torch.manual_seed(0)
        model = gpt.build_model(spec, manifest.num_features, manifest.num_classes)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        if streamed:
            sampling = {"batch_size": 16, "rank": 0, "world_size": 1, "seed": 0}
            data = SplitStream.load(root, manifest.snapshot_id, "train", columns=columns, workers=workers, **sampling)
            source = (tokens for tokens, _ in data.from_step(0, steps))
        else:
            source = iter(torch.randint(0, manifest.num_classes, (steps, 16, len(columns))))
        meter = StepMeter(16, spec.model.seq_len)
        for step in range(steps):
            if step == WARMUP:
                meter = StepMeter(16, spec.model.seq_len)
            with meter.waiting_for_data():
                tokens = next(source)
            inputs, targets = gpt.split_batch(tokens, spec)
            loss = gpt.loss_fn(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            meter.step_done()
        fractions.append(meter.summary()["data_wait_fraction"])
    return fractions[0], fractions[1], workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="size of the Parquet files in all")
    parser.add_argument("--files", type=int, default=8, help="how many part files")
    parser.add_argument("--steps", type=int, default=300, help="GPT steps for the loader stall")
    parser.add_argument("--repeats", type=int, default=3, help="baseline and first build pairs (medians)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tp-bench-snapshot-"))
    try:
        folder = work / "data"
        rows = write_files(folder, args.gb, args.files)
        size = sum(path.stat().st_size for path in folder.iterdir())
        source = FileSource(
            uri=str(folder),
            columns=FileColumns(label="label", features=[f"f{i}" for i in range(FEATURES)]),
            split=FileSplit(key="user"),
        )
        # Side by side, --repeats times: this machine's shared cores make one pair vary by +-5%.
        bases, firsts = [], []
        for repeat in range(args.repeats):
            bases.append(baseline(folder, work / "baseline.parquet"))
            first, parsed = timed_build(source, work / f"snapshots-{repeat}")
            firsts.append(first)
            assert parsed
        again, reparsed = timed_build(source, work / "snapshots-0")
        assert not reparsed
        base, first = statistics.median(bases), statistics.median(firsts)
        stall, floor, workers = loader_stall(work, args.steps)
        print(f"snapshot_throughput_ratio: {base / first:.3f}")
        print(f"unchanged_resnapshot_ratio: {again / first:.4f}")
        print(f"loader_stall_fraction: {stall:.4f}")
        print(f"detail_files: {args.files} files, {size / 1e9:.3f} GB, {rows} rows")
        print(f"detail_pyarrow_read_write_s: {[round(seconds, 2) for seconds in bases]}")
        print(f"detail_first_build_s: {[round(seconds, 2) for seconds in firsts]}  ({size / first / 1e6:.0f} MB/s)")
        print(f"detail_unchanged_build_s: {again:.4f}")
        print(f"detail_loader_stall_synthetic_floor: {floor:.4f}")
        print(f"detail_loader_prefetch_workers: {workers}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
