"""The Great Expectations suite passes a good snapshot and fails broken ones, naming what broke.

Broken snapshots are written through the builder's own low-level writers, exactly as a buggy
source or split would write them; nothing in GX is patched.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from training_platform.datasets import SnapshotManifest, build_snapshot, validate_snapshot
from training_platform.datasets.builder import assign_splits, source_table, write_snapshot, write_tables
from training_platform.datasets.sources import RawSource, load_source

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def raw() -> RawSource:
    return load_source("sklearn_digits")


def _failed(report) -> set[tuple[str, str | None]]:
    return {(result.expectation, result.column) for result in report.failures}


def test_a_good_snapshot_passes(tmp_path: Path) -> None:
    manifest = build_snapshot("sklearn_digits", tmp_path)
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert report.success, report.summary()
    assert (
        report.summary()
        == f"snapshot {manifest.snapshot_id[:12]}: all {len(report.results)} expectations passed"
    )
    checks = {result.check for result in report.results}
    assert {"splits disjoint by row_id", "row_id unique within each split", "no nulls"} <= checks
    assert all(result["success"] for result in report.results)


def test_a_label_out_of_range_fails(tmp_path: Path, raw: RawSource) -> None:
    labels = raw.labels.copy()
    labels[5] = 11
    broken = dataclasses.replace(raw, labels=labels)
    manifest = write_snapshot(tmp_path, broken, assign_splits(raw.labels))
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert not report.success
    assert ("expect_column_values_to_be_in_set", "label") in _failed(report)
    assert "expect_column_values_to_be_in_set(label)" in report.summary()
    label_result = next(r for r in report.failures if r.expectation == "expect_column_values_to_be_in_set")
    assert label_result.details["unexpected_count"] == 1 and label_result.details[
        "partial_unexpected_list"
    ] == [11]


def test_a_pixel_out_of_range_fails(tmp_path: Path, raw: RawSource) -> None:
    features = raw.features.copy()
    features[3, 7] = 17
    manifest = write_snapshot(
        tmp_path, dataclasses.replace(raw, features=features), assign_splits(raw.labels)
    )
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert _failed(report) == {("expect_column_values_to_be_between", "pixel_7")}


def test_a_null_fails(tmp_path: Path, raw: RawSource) -> None:
    tables = {split: source_table(raw, rows) for split, rows in assign_splits(raw.labels).items()}
    train = tables["train"]
    index = train.schema.get_field_index("pixel_9")
    values = train.column(index).to_numpy()
    mask = np.zeros(len(values), dtype=bool)
    mask[10] = True
    tables["train"] = train.set_column(index, "pixel_9", pa.array(values, mask=mask, type=pa.int16()))
    manifest = _write(tmp_path, raw, tables)
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert ("expect_column_values_to_not_be_null", "pixel_9") in _failed(report)


def test_overlapping_splits_fail(tmp_path: Path, raw: RawSource) -> None:
    splits = assign_splits(raw.labels)
    splits["test"] = np.sort(np.concatenate([splits["test"], splits["train"][:3]]))
    manifest = write_snapshot(tmp_path, raw, splits)
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    # Unique within each split, yet three row_ids sit in two splits.
    assert _failed(report) == {("expect_column_values_to_be_unique", "row_id")}
    assert report.failures[0].check == "splits disjoint by row_id"


def test_a_class_missing_from_a_split_fails(tmp_path: Path, raw: RawSource) -> None:
    splits = assign_splits(raw.labels)
    sevens = raw.labels[splits["validation"]] == 7
    splits["train"] = np.sort(np.concatenate([splits["train"], splits["validation"][sevens]]))
    splits["validation"] = splits["validation"][~sevens]
    manifest = write_snapshot(tmp_path, raw, splits)
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert _failed(report) == {
        ("expect_column_distinct_values_to_contain_set", "label"),
        ("expect_column_values_to_be_between", "fraction"),
    }
    presence = next(r for r in report.failures if r.column == "label")
    assert "validation" in presence.check


def test_a_corrupted_shard_fails_without_raising(tmp_path: Path) -> None:
    manifest: SnapshotManifest = build_snapshot("sklearn_digits", tmp_path)
    path = tmp_path / manifest.splits["train"][0].path
    path.write_bytes(path.read_bytes()[:-1])
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert not report.success
    assert report.results[0].expectation == "shards_match_manifest"
    assert str(path) in report.results[0].details["error"]


def _write(root: Path, raw: RawSource, tables: dict[str, pa.Table]) -> SnapshotManifest:
    return write_tables(
        root,
        tables,
        source=raw.name,
        source_sha256=raw.sha256,
        num_classes=raw.num_classes,
        feature_min=raw.feature_min,
        feature_max=raw.feature_max,
        split_seed=0,
    )


def test_the_text_snapshot_passes_its_own_suite(tmp_path: Path) -> None:
    # Next-token labels follow the language: no class-balance bounds, every other check as for digits.
    manifest = build_snapshot("python_stdlib_text", tmp_path)
    report = validate_snapshot(tmp_path, manifest.snapshot_id)
    assert report.success, report.summary()
    checks = {result.check for result in report.results}
    assert {"splits disjoint by row_id", "no nulls", f"label in 0..{manifest.num_classes - 1}"} <= checks
    assert not any("of its split" in check or "present in split" in check for check in checks)
