"""Read a snapshot's splits, verifying every shard's hash before it is parsed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_platform.datasets.manifest import LABEL, SnapshotManifest
from training_platform.datasets.store import SnapshotRoot, load_manifest, read_shard_bytes
from training_platform.errors import SnapshotError


def read_split(
    root: SnapshotRoot, snapshot_id: str, split: str, *, scaled: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Features (float32, scaled to [0, 1]; unscaled: int64 as stored, e.g. token ids) and labels (int64) of
    one split, in row_id order."""
    manifest = load_manifest(root, snapshot_id)
    return split_arrays(read_split_table(root, manifest, split), manifest, split, scaled=scaled)


def split_arrays(
    table: pa.Table, manifest: SnapshotManifest, split: str, *, scaled: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A split table's features and labels as read_split gives them (no features: a (rows, 0) array)."""
    for name in table.column_names:
        # Nulls would silently become NaN features; refuse them and point at the validator.
        if table.column(name).null_count:
            raise SnapshotError(
                f"split {split!r} of snapshot {manifest.snapshot_id} has nulls in column {name!r}; "
                f"run validate_snapshot for the full report and rebuild the snapshot"
            )
    columns = [table.column(name).to_numpy() for name in manifest.feature_columns]
    features = np.stack(columns, axis=1) if columns else np.empty((table.num_rows, 0), dtype=np.float32)
    labels = table.column(LABEL).to_numpy().astype(np.int64, copy=False)
    if not scaled:
        return features.astype(np.int64), labels
    return scale_features(features.astype(np.float32), manifest), labels


def scale_features(features: np.ndarray, manifest: SnapshotManifest, columns: list[str] | None = None) -> np.ndarray:
    """Features in [0, 1]: each by its own range where the manifest has them, else all by feature_max.
    COLUMNS: the features' names, where they are not all the manifest's feature columns."""
    if not features.shape[1]:
        return features  # a snapshot of text or images only
    if manifest.feature_ranges is None:
        return features / np.float32(manifest.feature_max)
    names = columns or manifest.feature_columns
    low, high = np.array([manifest.feature_ranges[name] for name in names], dtype=np.float32).T
    return (features - low) / np.maximum(high - low, np.float32(1e-12))  # a constant column scales to 0


def read_split_table(root: SnapshotRoot, manifest: SnapshotManifest, split: str) -> pa.Table:
    """One split as an Arrow table with the manifest's columns, shards verified and concatenated."""
    if split not in manifest.splits:
        raise SnapshotError(
            f"snapshot {manifest.snapshot_id} has no split {split!r}; valid splits: {', '.join(manifest.split_names)}"
        )
    tables = []
    for ref in manifest.splits[split]:
        data = read_shard_bytes(root, manifest.snapshot_id, ref)
        # Parse the bytes already verified, so the file cannot change between check and use.
        table = pq.read_table(pa.BufferReader(data))
        found = {field.name: str(field.type) for field in table.schema}
        if found != manifest.schema:
            raise SnapshotError(
                f"shard {root}/{ref.path} of snapshot {manifest.snapshot_id} has columns that differ "
                f"from its manifest's schema; rebuild the snapshot"
            )
        tables.append(table)
    return pa.concat_tables(tables)
