"""Building snapshots: deterministic, content addressed, stratified, never rewritten."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from training_platform.datasets import SnapshotManifest, build_snapshot, list_snapshots, load_manifest
from training_platform.datasets.builder import assign_splits
from training_platform.datasets.sources import load_source
from training_platform.errors import SnapshotError


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


def test_same_source_gives_same_id_and_identical_bytes(built, tmp_path: Path) -> None:
    root, manifest = built
    again = build_snapshot("sklearn_digits", tmp_path)
    assert again.snapshot_id == manifest.snapshot_id
    assert _files(tmp_path) == _files(root)


def test_rebuilding_leaves_every_file_untouched(scratch) -> None:
    root, manifest = scratch
    before = {
        path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in root.rglob("*") if path.is_file()
    }
    assert build_snapshot("sklearn_digits", root).snapshot_id == manifest.snapshot_id
    after = {
        path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in root.rglob("*") if path.is_file()
    }
    assert after == before  # same files, no temp leftovers, none replaced


def test_rebuilding_repairs_a_damaged_shard(scratch) -> None:
    root, manifest = scratch
    _, ref = next(manifest.shards())
    (root / ref.path).write_bytes(b"garbage")
    build_snapshot("sklearn_digits", root)
    assert hashlib.sha256((root / ref.path).read_bytes()).hexdigest() == ref.sha256


def test_manifest_is_sealed_and_complete(built) -> None:
    root, manifest = built
    raw = json.loads((root / f"{manifest.snapshot_id}.json").read_text())
    assert manifest.snapshot_id == manifest.content_hash()
    assert raw["snapshot_id"] == manifest.snapshot_id
    assert "created_at" not in json.dumps(raw)  # no timestamp: same source, same id
    assert manifest.source == "sklearn_digits"
    assert manifest.source_sha256 == load_source("sklearn_digits").sha256
    assert manifest.num_features == 64 and manifest.num_classes == 10
    assert list(manifest.schema) == ["row_id", *[f"pixel_{i}" for i in range(64)], "label"]
    assert manifest.schema["label"] == "int64" and manifest.schema["row_id"] == "int64"
    assert manifest.schema["pixel_0"] == "int16"
    assert manifest.split_names == ["train", "validation", "test"]
    assert manifest.total_rows == 1797
    for split, refs in manifest.splits.items():
        assert len(refs) >= 2
        assert sum(ref.rows for ref in refs) == manifest.rows[split]
        for ref in refs:
            data = (root / ref.path).read_bytes()
            assert ref.path == f"shards/{ref.sha256}.parquet"
            assert (len(data), hashlib.sha256(data).hexdigest()) == (ref.bytes, ref.sha256)
    assert load_manifest(root, manifest.snapshot_id) == manifest


def test_splits_are_about_70_15_15(built) -> None:
    _, manifest = built
    fractions = {split: rows / manifest.total_rows for split, rows in manifest.rows.items()}
    assert fractions["train"] == pytest.approx(0.70, abs=0.01)
    assert fractions["validation"] == pytest.approx(0.15, abs=0.01)
    assert fractions["test"] == pytest.approx(0.15, abs=0.01)


def test_splits_are_disjoint_complete_and_stratified() -> None:
    labels = load_source("sklearn_digits").labels
    splits = assign_splits(labels)
    rows = np.concatenate(list(splits.values()))
    assert len(rows) == len(np.unique(rows)) == len(labels)  # disjoint and covering
    overall = np.bincount(labels, minlength=10) / len(labels)
    for split, members in splits.items():
        share = np.bincount(labels[members], minlength=10) / len(members)
        assert np.abs(share - overall).max() < 0.01, split


def test_split_is_fixed_by_its_seed() -> None:
    labels = load_source("sklearn_digits").labels
    first, second, other = assign_splits(labels), assign_splits(labels), assign_splits(labels, seed=7)
    assert all(np.array_equal(first[split], second[split]) for split in first)
    assert not np.array_equal(first["test"], other["test"])


def test_another_seed_is_another_snapshot(built, tmp_path: Path) -> None:
    _, manifest = built
    assert build_snapshot("sklearn_digits", tmp_path, seed=7).snapshot_id != manifest.snapshot_id


def test_list_snapshots(built, tmp_path: Path) -> None:
    root, manifest = built
    assert [item.snapshot_id for item in list_snapshots(root)] == [manifest.snapshot_id]
    assert list_snapshots(tmp_path / "nowhere") == []


def test_unknown_source_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="unknown dataset source 'mnist'.*sklearn_digits"):
        build_snapshot("mnist", tmp_path)


def test_manifest_round_trips_through_json(built) -> None:
    _, manifest = built
    assert SnapshotManifest.from_json(manifest.to_json(), origin="test") == manifest
