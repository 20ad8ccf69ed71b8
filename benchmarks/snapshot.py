"""Snapshot benchmark: a snapshot of a team's own Parquet files against pyarrow's own read and write of them.

Writes --gb of Parquet (random float features, an integer label, a string key; --files part files) to a
temporary directory, then, in one run:

  snapshot_throughput_ratio     pyarrow reading the files and writing them back as one zstd Parquet file, over
                                build_file_snapshot of the same files (a first build: read, hash, split by key,
                                shard, hash and write each shard durably, publish the manifest); > 1 means the
                                snapshot is faster (target >= 0.7).
  unchanged_resnapshot_ratio    a second build of the unchanged files over the first (target <= 0.05).

The loader-stall figure of issue 21 needs `session.dataset`, which does not exist yet: not measured here.

    python benchmarks/snapshot.py              # 1 GB: a few minutes on 2 cores
    python benchmarks/snapshot.py --gb 0.1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from training_platform.datasets.file_spec import FileColumns, FileSplit  # noqa: E402
from training_platform.datasets.files import FileSource, build_file_snapshot  # noqa: E402

FEATURES = 16


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="size of the Parquet files in all")
    parser.add_argument("--files", type=int, default=8, help="how many part files")
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
        base = baseline(folder, work / "baseline.parquet")
        first, parsed = timed_build(source, work / "snapshots")
        again, reparsed = timed_build(source, work / "snapshots")
        assert parsed and not reparsed
        print(f"snapshot_throughput_ratio: {base / first:.3f}")
        print(f"unchanged_resnapshot_ratio: {again / first:.4f}")
        print(f"detail_files: {args.files} files, {size / 1e9:.3f} GB, {rows} rows")
        print(f"detail_pyarrow_read_write_s: {base:.2f}")
        print(f"detail_first_build_s: {first:.2f}  ({size / first / 1e6:.0f} MB/s)")
        print(f"detail_unchanged_build_s: {again:.4f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
