"""Build a snapshot: split a source deterministically, write Parquet shards, publish the manifest."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_platform.datasets.manifest import LABEL, ROLE_COLUMNS, ROW_ID, SPLITS, ShardRef, SnapshotManifest
from training_platform.datasets.sources import RawSource, load_source
from training_platform.datasets.store import SnapshotRoot, write_manifest, write_shard
from training_platform.datasets.text import write_tokenizer
from training_platform.errors import SnapshotError
from training_platform.spec.file_source import SPLIT_SEED

_T = TypeVar("_T")
SPLIT_FRACTIONS = {"train": 0.70, "validation": 0.15, "test": 0.15}
MIN_SHARDS_PER_SPLIT = 2
MAX_SHARD_ROWS = 1024
ROW_GROUP_ROWS = 256


def build_snapshot(source: str, root: SnapshotRoot, *, seed: int = SPLIT_SEED) -> SnapshotManifest:
    """Build (or find) the snapshot of a registered source under root; same source, same id. A text
    source's tokenizer is stored beside it (again when found: a snapshot is useless without it)."""
    raw = load_source(source)
    manifest = write_snapshot(root, raw, assign_splits(raw.labels, seed=seed), seed=seed)
    if raw.tokenizer is not None:
        write_tokenizer(root, manifest.source_sha256, raw.tokenizer)
    return manifest


def assign_splits(labels: np.ndarray, *, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
    """Row indices per split, stratified by label, sorted; independent of numpy's RNG implementation."""
    # Ranking rows by a hash of (seed, row index) gives a shuffle that no library upgrade can change.
    keys = np.array([_shuffle_key(seed, row) for row in range(len(labels))], dtype=np.uint64)
    parts: dict[str, list[np.ndarray]] = {split: [] for split in SPLIT_FRACTIONS}
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[np.argsort(keys[members], kind="stable")]
        n_validation = round(len(members) * SPLIT_FRACTIONS["validation"])
        n_test = round(len(members) * SPLIT_FRACTIONS["test"])
        n_train = len(members) - n_validation - n_test
        parts["train"].append(members[:n_train])
        parts["validation"].append(members[n_train : n_train + n_validation])
        parts["test"].append(members[n_train + n_validation :])
    return {split: np.sort(np.concatenate(chunks)) for split, chunks in parts.items()}


def _shuffle_key(seed: int, row: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{row}".encode()).digest()[:8], "big")


def write_snapshot(
    root: SnapshotRoot, raw: RawSource, split_rows: dict[str, np.ndarray], *, seed: int = SPLIT_SEED
) -> SnapshotManifest:
    """Write `raw` split as given; row ids are the rows' positions in the source."""
    tables = {split: source_table(raw, rows) for split, rows in split_rows.items()}
    return write_tables(
        root,
        tables,
        source=raw.name,
        source_sha256=raw.sha256,
        num_classes=raw.num_classes,
        feature_min=raw.feature_min,
        feature_max=raw.feature_max,
        split_seed=seed,
    )


def source_table(raw: RawSource, rows: np.ndarray) -> pa.Table:
    """The rows of `raw` as a table: row_id, one column per feature, label."""
    columns: dict[str, pa.Array] = {ROW_ID: pa.array(rows.astype(np.int64))}
    for index in range(raw.features.shape[1]):
        columns[f"{raw.feature_prefix}_{index}"] = pa.array(raw.features[rows, index])
    columns[LABEL] = pa.array(raw.labels[rows].astype(np.int64))
    return pa.table(columns)


def write_tables(
    root: SnapshotRoot,
    tables: dict[str, pa.Table],
    *,
    source: str,
    source_sha256: str,
    num_classes: int,
    feature_min: int | float,
    feature_max: int | float,
    split_seed: int,
    label_names: list[str] | None = None,
    feature_ranges: dict[str, tuple[float, float]] | None = None,
    shard_rows: int = MAX_SHARD_ROWS,
    row_group_rows: int = ROW_GROUP_ROWS,
    dictionary: bool = True,
) -> SnapshotManifest:
    """The low-level writer: shard each split's table, write the shards, then the manifest, last."""
    schemas = {table.schema for table in tables.values()}
    if len(schemas) != 1:
        raise SnapshotError(f"splits of source {source!r} disagree on their schema; every split needs the same columns")
    schema = schemas.pop()

    def write(part: pa.Table) -> ShardRef:
        return write_shard(root, encode_parquet(part, row_group_rows, dictionary), rows=part.num_rows)

    # Canonical split order first, so manifests read train, validation, test. Every split's shards go to one pool,
    # with a spare thread per core: a thread waiting for its shard's fsync leaves a core to the encoders.
    named = [(split, part) for split in sorted(tables, key=_split_order) for part in _shards(tables[split], shard_rows)]
    refs = parallel_map(write, [part for _, part in named], threads=2 * (os.cpu_count() or 1))
    splits: dict[str, list[ShardRef]] = {}
    for (split, _), ref in zip(named, refs, strict=True):
        splits.setdefault(split, []).append(ref)
    manifest = SnapshotManifest(
        source=source,
        source_sha256=source_sha256,
        schema={field.name: str(field.type) for field in schema},
        num_features=sum(name not in (ROW_ID, LABEL, *ROLE_COLUMNS) for name in schema.names),
        num_classes=num_classes,
        feature_min=feature_min,
        feature_max=feature_max,
        split_seed=split_seed,
        splits=splits,
        rows={split: tables[split].num_rows for split in splits},
        label_names=label_names,
        feature_ranges=feature_ranges,
    )
    return write_manifest(root, manifest)


def _shards(table: pa.Table, shard_rows: int) -> list[pa.Table]:
    """Slices of about shard_rows rows (no copies); at least MIN_SHARDS_PER_SPLIT, so two ranks share a split."""
    count = max(MIN_SHARDS_PER_SPLIT, math.ceil(table.num_rows / shard_rows))
    bounds = np.linspace(0, table.num_rows, count + 1).round().astype(int)
    return [table.slice(start, stop - start) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def parallel_map(function: Callable[..., _T], *iterables: Iterable, threads: int | None = None) -> list[_T]:
    """`map` on a thread per core (or `threads`), results in order: for work that releases the GIL (Arrow,
    hashlib, numpy, file writes)."""
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        return list(pool.map(function, *iterables))


def _split_order(name: str) -> tuple[int, str]:
    return (SPLITS.index(name) if name in SPLITS else len(SPLITS), name)


def encode_parquet(table: pa.Table, row_group_rows: int = ROW_GROUP_ROWS, dictionary: bool = True) -> memoryview:
    """Parquet bytes that depend only on the table (and the pyarrow version that writes them), in Arrow's memory:
    a copy into Python bytes would fault in fresh pages for every shard."""
    sink = pa.BufferOutputStream()
    # Fixed row groups and codec; tables built from arrays carry no pandas or timestamp metadata.
    pq.write_table(
        table, sink, row_group_size=row_group_rows, compression="zstd", compression_level=3, use_dictionary=dictionary
    )
    return memoryview(sink.getvalue())
