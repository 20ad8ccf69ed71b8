"""Reading snapshots: verified shards, scaled features, errors a user can act on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training_platform.datasets import load_manifest, read_split
from training_platform.datasets.reader import read_split_table
from training_platform.errors import SnapshotError


def test_read_split_shapes_types_and_scale(built) -> None:
    root, manifest = built
    for split in manifest.split_names:
        features, labels = read_split(root, manifest.snapshot_id, split)
        assert features.dtype == np.float32 and features.shape == (manifest.rows[split], 64)
        assert labels.dtype == np.int64 and labels.shape == (manifest.rows[split],)
        assert features.min() == 0.0 and features.max() == 1.0
        assert set(np.unique(labels)) == set(range(10))


def test_rows_come_in_a_stable_row_id_order(built) -> None:
    root, manifest = built
    row_ids = read_split_table(root, manifest, "train").column("row_id").to_numpy()
    assert np.all(np.diff(row_ids) > 0)
    first, second = (
        read_split(root, manifest.snapshot_id, "train"),
        read_split(root, manifest.snapshot_id, "train"),
    )
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])


def test_features_match_the_source(built) -> None:
    from sklearn.datasets import load_digits

    root, manifest = built
    digits = load_digits()
    row_ids = read_split_table(root, manifest, "test").column("row_id").to_numpy()
    features, labels = read_split(root, manifest.snapshot_id, "test")
    assert np.array_equal(features * 16, digits.data[row_ids].astype(np.float32))
    assert np.array_equal(labels, digits.target[row_ids])


def test_a_corrupted_byte_names_the_shard_and_snapshot(scratch) -> None:
    root, manifest = scratch
    ref = manifest.splits["validation"][1]
    path = root / ref.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError) as caught:
        read_split(root, manifest.snapshot_id, "validation")
    message = str(caught.value)
    assert str(path) in message and manifest.snapshot_id in message and "corrupted" in message
    read_split(root, manifest.snapshot_id, "train")  # other splits still read


def test_a_missing_shard_names_the_shard_and_snapshot(scratch) -> None:
    root, manifest = scratch
    path = root / manifest.splits["test"][0].path
    path.unlink()
    with pytest.raises(SnapshotError, match="missing") as caught:
        read_split(root, manifest.snapshot_id, "test")
    assert str(path) in str(caught.value) and manifest.snapshot_id in str(caught.value)


def test_unknown_split_names_the_valid_ones(built) -> None:
    root, manifest = built
    with pytest.raises(SnapshotError, match="no split 'holdout'; valid splits: train, validation, test"):
        read_split(root, manifest.snapshot_id, "holdout")


@pytest.mark.parametrize("snapshot_id", ["0" * 64, "../../etc/passwd", "abc"])
def test_missing_snapshot_says_how_to_fix_it(built, snapshot_id: str) -> None:
    root, _ = built
    with pytest.raises(SnapshotError) as caught:
        load_manifest(root, snapshot_id)
    assert str(caught.value) == (
        f"snapshot {snapshot_id} not found under {root}; build one with "
        f"build_snapshot('sklearn_digits', root) (or `tp demo`) or check the id"
    )
    with pytest.raises(SnapshotError, match="not found"):
        read_split(root, snapshot_id, "train")


def test_an_edited_manifest_is_refused(scratch) -> None:
    root, manifest = scratch
    path = root / f"{manifest.snapshot_id}.json"
    body = json.loads(path.read_text())
    body["rows"]["train"] += 1
    path.write_text(json.dumps(body))
    with pytest.raises(SnapshotError, match="edited or corrupted"):
        load_manifest(root, manifest.snapshot_id)


def test_a_malformed_manifest_is_refused(scratch) -> None:
    root, manifest = scratch
    (root / f"{manifest.snapshot_id}.json").write_text("{not json")
    with pytest.raises(SnapshotError, match="not a valid snapshot manifest"):
        load_manifest(root, manifest.snapshot_id)


def test_importing_the_package_does_not_import_great_expectations() -> None:
    import subprocess
    import sys

    code = "import sys, training_platform.datasets; print('great_expectations' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.strip() == "False"
