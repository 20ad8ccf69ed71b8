"""Snapshots as of a day, built from a landing directory of daily drops: immutable and content addressed."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from training_platform.datasets import build_snapshot, load_manifest, read_split
from training_platform.datasets.daily import build_dated_snapshot, build_snapshot_as_of, list_drops, seed_landing
from training_platform.datasets.reader import read_split_table
from training_platform.errors import SnapshotError

NOV = [date(2026, 11, day) for day in range(1, 8)]


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three drops (2, 3, 4 November), seeded once and only read by the tests that share it."""
    path = tmp_path_factory.mktemp("landing")
    seed_landing(path, NOV[1], 3)
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_seeding_is_deterministic_and_never_overwrites(tmp_path: Path, landing: Path) -> None:
    again = seed_landing(tmp_path / "landing", NOV[1], 3)
    assert [(d.day, d.sha256) for d in again] == [(d.day, d.sha256) for d in list_drops(landing)]
    assert [d.day for d in again] == NOV[1:4]
    (tmp_path / "landing" / "2026-11-02.parquet").write_bytes(b"edited by hand")
    seed_landing(tmp_path / "landing", NOV[1], 3)
    assert (tmp_path / "landing" / "2026-11-02.parquet").read_bytes() == b"edited by hand"


def test_a_snapshot_holds_the_drops_dated_on_or_before_its_day(tmp_path: Path, landing: Path) -> None:
    built = {day: build_dated_snapshot("digits_daily", tmp_path, landing, day) for day in NOV[1:6]}
    assert [len(built[day].drops) for day in NOV[1:6]] == [1, 2, 3, 3, 3]
    totals = [built[day].manifest.total_rows for day in NOV[1:4]]
    assert totals == sorted(totals) and totals[-1] == 1797 and len(set(totals)) == 3
    # No new drop after the 4th: the 5th and 6th are the same snapshot.
    assert len({built[day].manifest.snapshot_id for day in NOV[3:6]}) == 1
    with pytest.raises(SnapshotError, match="no digits_daily drops dated on or before 2026-11-01"):
        build_dated_snapshot("digits_daily", tmp_path, landing, NOV[0])


def test_the_same_drops_give_the_same_id(tmp_path: Path, landing: Path) -> None:
    first = build_dated_snapshot("digits_daily", tmp_path / "a", landing, NOV[2]).manifest
    # Rebuilt into another root from a freshly seeded landing directory: byte-identical snapshot.
    reseeded = tmp_path / "landing"
    seed_landing(reseeded, NOV[1], 3)
    second = build_dated_snapshot("digits_daily", tmp_path / "b", reseeded, NOV[2]).manifest
    assert first.snapshot_id == second.snapshot_id
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_a_changed_drop_gives_a_new_id_and_leaves_the_old_snapshot_untouched(tmp_path: Path) -> None:
    landing, root = tmp_path / "landing", tmp_path / "snapshots"
    seed_landing(landing, NOV[1], 3)
    old = build_dated_snapshot("digits_daily", root, landing, NOV[3]).manifest
    before_day_3 = build_dated_snapshot("digits_daily", root, landing, NOV[2]).manifest
    files_before = _files(root)

    # A correction of the 4 November drop: one label changed.
    path = landing / "2026-11-04.parquet"
    table = pq.read_table(path)
    labels = table.column("label").to_numpy().copy()
    labels[0] = (labels[0] + 1) % 10
    pq.write_table(table.set_column(table.schema.get_field_index("label"), "label", [labels]), path)

    new = build_dated_snapshot("digits_daily", root, landing, NOV[3]).manifest
    assert new.snapshot_id != old.snapshot_id
    # Every file of the old snapshots is still there, byte for byte; the old one still reads.
    files_after = _files(root)
    assert {name: files_after[name] for name in files_before} == files_before
    assert load_manifest(root, old.snapshot_id) == old
    _, old_labels = read_split(root, old.snapshot_id, "train")
    assert len(old_labels) == old.rows["train"]
    # Snapshots of earlier days do not hold the changed drop: same id as before.
    assert build_dated_snapshot("digits_daily", root, landing, NOV[2]).manifest.snapshot_id == before_day_3.snapshot_id


def test_a_row_keeps_its_split_on_later_days(tmp_path: Path, landing: Path) -> None:
    early = build_dated_snapshot("digits_daily", tmp_path, landing, NOV[1]).manifest
    late = build_dated_snapshot("digits_daily", tmp_path, landing, NOV[3]).manifest
    for split in ("train", "validation", "test"):
        early_ids = set(read_split_table(tmp_path, early, split).column("row_id").to_pylist())
        late_ids = set(read_split_table(tmp_path, late, split).column("row_id").to_pylist())
        assert early_ids and early_ids <= late_ids, split


def test_a_csv_drop_is_the_same_data_as_its_parquet_drop(tmp_path: Path, landing: Path) -> None:
    csv_landing = tmp_path / "csv"
    csv_landing.mkdir()
    pa_csv.write_csv(pq.read_table(landing / "2026-11-02.parquet"), csv_landing / "2026-11-02.csv")
    from_csv = build_dated_snapshot("digits_daily", tmp_path, csv_landing, NOV[1]).manifest
    from_parquet = build_dated_snapshot("digits_daily", tmp_path, landing, NOV[1]).manifest
    assert from_csv.snapshot_id == from_parquet.snapshot_id


def test_undated_sources_ignore_the_day(tmp_path: Path, landing: Path) -> None:
    built = [build_snapshot_as_of("sklearn_digits", tmp_path, as_of=day, landing=landing) for day in NOV]
    ids = {snapshot.manifest.snapshot_id for snapshot in built}
    assert ids == {build_snapshot("sklearn_digits", tmp_path).snapshot_id}


def test_bad_drops_are_refused_naming_the_file(tmp_path: Path, landing: Path) -> None:
    bad = tmp_path / "landing"
    bad.mkdir()
    table = pq.read_table(landing / "2026-11-02.parquet")
    pq.write_table(table.drop_columns(["pixel_7"]), bad / "2026-11-02.parquet")
    with pytest.raises(SnapshotError, match=r"2026-11-02\.parquet lacks columns pixel_7"):
        build_dated_snapshot("digits_daily", tmp_path / "s", bad, NOV[1])
    pa_csv.write_csv(table, bad / "2026-11-02.csv")
    with pytest.raises(SnapshotError, match="2 drops for 2026-11-02"):
        list_drops(bad)


def test_stray_files_are_not_drops(tmp_path: Path) -> None:
    for name in ("notes.txt", ".2026-11-02.parquet.tmp", "2026-13-01.parquet", "2026-11-02.json"):
        (tmp_path / name).write_bytes(b"x")
    assert list_drops(tmp_path) == []
    assert list_drops(tmp_path / "missing") == []
