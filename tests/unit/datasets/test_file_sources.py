"""Snapshots of a team's own files (Parquet, CSV, JSON Lines): roles, splits, unchanged rebuilds, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from training_platform.datasets import load_manifest, read_split, validate_snapshot
from training_platform.datasets.files import FileSource, build_file_snapshot
from training_platform.datasets.manifest import LABEL, ROW_ID
from training_platform.datasets.reader import read_split_table
from training_platform.errors import SnapshotError
from training_platform.spec.file_source import FileColumns, FileSplit


@pytest.fixture(scope="module")
def wine() -> pa.Table:
    from sklearn.datasets import load_wine  # bundled with scikit-learn: no download

    return pa.Table.from_pandas(load_wine(as_frame=True).frame, preserve_index=False)


def _parquet_folder(table: pa.Table, folder: Path, parts: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(np.array_split(np.arange(table.num_rows), parts)):
        pq.write_table(table.take(pa.array(rows)), folder / f"part-{index}.parquet")
    return folder


def _all_rows(root: Path, snapshot_id: str) -> pa.Table:
    manifest = load_manifest(root, snapshot_id)
    table = pa.concat_tables([read_split_table(root, manifest, split) for split in manifest.split_names])
    return table.sort_by(ROW_ID)


def _shard_times(root: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in (root / "shards").iterdir()}


def test_a_parquet_folder_becomes_a_snapshot_with_every_row_by_role(wine, tmp_path):
    data = _parquet_folder(wine, tmp_path / "wine")
    built = build_file_snapshot(FileSource(uri=str(data), columns=FileColumns(label="target")), tmp_path / "snap")
    manifest = built.manifest
    assert manifest.source == str(data) and manifest.total_rows == wine.num_rows
    assert (manifest.num_features, manifest.num_classes, manifest.label_names) == (13, 3, None)
    columns = list(manifest.schema)
    assert columns[0] == ROW_ID and columns[-1] == LABEL and columns[1:-1] == wine.column_names[:-1]
    assert set(manifest.rows) == {"train", "validation", "test"} and min(manifest.rows.values()) > 0
    rows = _all_rows(tmp_path / "snap", manifest.snapshot_id)
    # Row ids are positions in file order: every row once, each with its own label and features.
    assert rows.column(ROW_ID).to_pylist() == list(range(wine.num_rows))
    assert rows.column(LABEL).to_pylist() == wine.column("target").to_pylist()
    assert rows.column("alcohol").to_pylist() == wine.column("alcohol").to_pylist()
    assert manifest.feature_min == pytest.approx(min(pa.compute.min(c).as_py() for c in wine.columns[:-1]))

    # Training reads each feature scaled by its own range: proline (up to 1680) and hue (under 2) alike.
    features = np.concatenate([read_split(tmp_path / "snap", manifest.snapshot_id, s)[0] for s in manifest.split_names])
    np.testing.assert_allclose(features.min(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(features.max(axis=0), 1, atol=1e-6)

    report = validate_snapshot(tmp_path / "snap", manifest.snapshot_id)
    assert report.success, report.summary()


def test_unchanged_files_give_the_same_snapshot_without_a_parse_or_a_write(wine, tmp_path):
    data = _parquet_folder(wine, tmp_path / "wine")
    source = FileSource(uri=str(data), columns=FileColumns(label="target"))
    root = tmp_path / "snap"
    first = build_file_snapshot(source, root)
    shards = _shard_times(root)

    again = build_file_snapshot(source, root)
    assert (again.manifest.snapshot_id, again.parsed) == (first.manifest.snapshot_id, False)

    # Touched and copied, not changed: hashed, found, nothing rewritten.
    part = data / "part-1.parquet"
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))
    touched = build_file_snapshot(source, root)
    assert touched.manifest.snapshot_id == first.manifest.snapshot_id
    assert _shard_times(root) == shards

    # A changed file: a new snapshot, and the old one stays whole.
    pq.write_table(wine.slice(0, 10), data / "part-1.parquet")
    changed = build_file_snapshot(source, root)
    assert changed.parsed and changed.manifest.snapshot_id != first.manifest.snapshot_id
    assert changed.manifest.total_rows == wine.num_rows - 59 + 10
    assert load_manifest(root, first.manifest.snapshot_id).total_rows == wine.num_rows


def test_csv_and_json_lines_hold_the_same_rows_as_parquet(wine, tmp_path):
    (tmp_path / "csv").mkdir()
    pa_csv.write_csv(wine, tmp_path / "csv" / "wine.csv")
    lines = "".join(json.dumps(row) + "\n" for row in wine.to_pylist())
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "wine.jsonl").write_text(lines)
    columns = FileColumns(label="target")
    parquet = build_file_snapshot(FileSource(uri=str(_parquet_folder(wine, tmp_path / "pq")), columns=columns),
                                  tmp_path / "snap")
    for uri in (tmp_path / "csv" / "wine.csv", tmp_path / "jsonl"):
        other = build_file_snapshot(FileSource(uri=str(uri), columns=columns), tmp_path / "snap")
        assert other.manifest.rows == parquet.manifest.rows, uri
        assert _all_rows(tmp_path / "snap", other.manifest.snapshot_id).to_pydict() == _all_rows(
            tmp_path / "snap", parquet.manifest.snapshot_id
        ).to_pydict()


def test_a_glob_picks_its_files_and_features_and_string_labels_are_read_by_role(wine, tmp_path):
    data = _parquet_folder(wine, tmp_path / "wine")
    pa_csv.write_csv(wine, data / "copy.csv")  # not matched by the glob
    kinds = np.array(["red", "rose", "white"])[wine.column("target").to_numpy()]
    named = wine.drop_columns(["target"]).append_column("kind", pa.array(kinds))
    pq.write_table(named, data / "part-0.parquet")
    for index in (1, 2):
        (data / f"part-{index}.parquet").unlink()
    source = FileSource(uri=str(data / "*.parquet"), columns=FileColumns(label="kind", features=["hue", "alcohol"]))
    manifest = build_file_snapshot(source, tmp_path / "snap").manifest
    assert list(manifest.schema) == [ROW_ID, "hue", "alcohol", LABEL]
    assert manifest.label_names == ["red", "rose", "white"] and manifest.num_classes == 3
    rows = _all_rows(tmp_path / "snap", manifest.snapshot_id)
    assert rows.column(LABEL).to_pylist() == wine.column("target").to_pylist()

    with pytest.raises(SnapshotError, match=r"mixes file formats \(csv, parquet\); keep one format"):
        build_file_snapshot(FileSource(uri=str(data), columns=FileColumns(label="kind")), tmp_path / "snap")


def _ids(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"user": [f"u{i}" for i in range(n)], "x": rng.normal(size=n), "y": rng.integers(0, 2, n)})


def test_a_split_by_key_is_deterministic_whatever_the_row_order(tmp_path):
    table = _ids(2000)
    pq.write_table(table, tmp_path / "a.parquet")
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(2000)))
    (tmp_path / "b").mkdir()
    pq.write_table(shuffled, tmp_path / "b" / "b.parquet")
    split = FileSplit(key="user", fractions={"train": 0.8, "test": 0.2})
    members = []
    for uri in (tmp_path / "a.parquet", tmp_path / "b"):
        source = FileSource(uri=str(uri), columns=FileColumns(label="y", features=["x"]), split=split)
        manifest = build_file_snapshot(source, tmp_path / "snap").manifest
        assert list(manifest.rows) == ["train", "test"]
        assert abs(manifest.rows["test"] / 2000 - 0.2) < 0.03, manifest.rows
        test_x = read_split_table(tmp_path / "snap", manifest, "test").column("x").to_pylist()
        members.append(sorted(test_x))
    assert members[0] == members[1]  # the same users in test, wherever their rows were


def test_string_keys_hashed_in_parts_as_bytes_hash_as_one_call_on_strings_does():
    from pandas.util import hash_array

    from training_platform.datasets.files import _key_hashes

    keys = [f"user-{n}" for n in range(450_000)] + ["é-ü", "日本語", ""]  # several parts; UTF-8 beyond ASCII
    table = pa.table({"user": keys})
    source = FileSource(uri="unused", columns=FileColumns(label="y"), split=FileSplit(key="user", seed=5))
    whole = hash_array(np.array(keys, dtype=object), hash_key=f"{5:016d}", categorize=False)
    assert np.array_equal(_key_hashes(table, source), whole)  # a split never depends on how it was computed


def test_an_existing_split_column_is_kept(tmp_path):
    table = _ids(30).append_column("part", pa.array(["train"] * 20 + ["validation"] * 5 + ["test"] * 5))
    pq.write_table(table, tmp_path / "a.parquet")
    source = FileSource(uri=str(tmp_path / "a.parquet"), columns=FileColumns(label="y"), split=FileSplit(column="part"))
    manifest = build_file_snapshot(source, tmp_path / "snap").manifest
    assert manifest.rows == {"train": 20, "validation": 5, "test": 5}
    assert list(manifest.schema) == [ROW_ID, "x", LABEL]  # the split and string columns are not features
    assert read_split_table(tmp_path / "snap", manifest, "test").column(ROW_ID).to_pylist() == list(range(25, 30))


def _refused(tmp_path: Path, source: FileSource, match: str) -> None:
    with pytest.raises(SnapshotError, match=match):
        build_file_snapshot(source, tmp_path / "snap")
    assert not list((tmp_path / "snap").glob("*.json")), "nothing is published for a refused source"


def test_bad_sources_are_refused_naming_the_problem_and_the_fix(tmp_path):
    table = _ids(40)
    pq.write_table(table, tmp_path / "a.parquet")
    columns = FileColumns(label="y", features=["x"])
    _refused(tmp_path, FileSource(uri=str(tmp_path / "none-*.parquet"), columns=columns),
             r"matches no data files; point it at a file, a directory or a glob")
    _refused(tmp_path, FileSource(uri=str(tmp_path / "a.parquet"), columns=FileColumns(label="y", features=["z"])),
             r"dataset.columns.features: column 'z' is not in .*; its columns are user, x, y")
    _refused(tmp_path, FileSource(uri=str(tmp_path / "a.parquet"), columns=FileColumns(label="y", features=["user"])),
             r"feature column 'user' is string, not numeric")
    _refused(tmp_path, FileSource(uri=str(tmp_path / "a.parquet"), columns=columns,
                                  split=FileSplit(fractions={"train": 0.999, "test": 0.001})),
             r"dataset.split leaves test empty \(40 rows in all\); raise its fraction")

    nulls = table.set_column(2, "y", pa.array([None, *table.column("y").to_pylist()[1:]], pa.int64()))
    (tmp_path / "nulls").mkdir()
    pq.write_table(nulls, tmp_path / "nulls" / "a.parquet")
    _refused(tmp_path, FileSource(uri=str(tmp_path / "nulls"), columns=columns),
             r"label column 'y' has 1 empty values \(the first in row 0\); drop or fill those rows")

    (tmp_path / "mixed").mkdir()
    pq.write_table(table, tmp_path / "mixed" / "a.parquet")
    pq.write_table(table.set_column(1, "x", table.column("x").cast(pa.string())), tmp_path / "mixed" / "b.parquet")
    _refused(tmp_path, FileSource(uri=str(tmp_path / "mixed"), columns=columns),
             r"conflicting schemas: column 'x' is double in .*a.parquet but string in .*b.parquet")


def test_the_split_settings_are_checked_where_the_spec_is_read():
    with pytest.raises(ValidationError, match="sum to 0.9; make them sum to 1"):
        FileSplit(fractions={"train": 0.7, "test": 0.2})
    with pytest.raises(ValidationError, match="either column .* or key"):
        FileSplit(column="part", key="user")
    with pytest.raises(ValidationError, match="names x more than once"):
        FileColumns(label="y", features=["x", "x"])


def test_the_specs_expectations_on_its_own_columns_join_the_snapshot_suite(tmp_path):
    from training_platform.datasets.files import read_source_table
    from training_platform.spec.file_source import FileExpectations

    example = Path(__file__).resolve().parents[3] / "examples" / "own_data"
    spec = yaml.safe_load((example / "spec.yaml").read_text())
    source = FileSource(uri=str(example / "data"), columns=FileColumns(label="cultivar"))
    manifest = build_file_snapshot(source, tmp_path / "snap").manifest
    frame = read_source_table(source).to_pandas()
    declared = FileExpectations.model_validate(spec["dataset"]["expectations"])  # the example's own
    passed = validate_snapshot(tmp_path / "snap", manifest.snapshot_id, (frame, declared))
    assert passed.success, passed.summary()
    own = [r for r in passed.results if r.check.endswith("(dataset.expectations)")]
    assert len(own) >= 6 and {"cultivar", "alcohol"} <= {r.column for r in own}

    strict = FileExpectations.model_validate({
        "rows": {"min": 200},
        "columns": {
            "alcohol": {"max": 14.0, "type": "double"},
            "cultivar": {"values": ["barolo", "barbera"], "type": "string"},
            "magnesium": {"unique": True},
            "vintage": {"not_null": True},
        },
    })
    failed = validate_snapshot(tmp_path / "snap", manifest.snapshot_id, (frame, strict))
    assert not failed.success
    by_check = {r.check.removesuffix(" (dataset.expectations)"): r for r in failed.failures}
    assert set(by_check) == {
        "rows 200..any", "alcohol in ..14", "cultivar one of ['barolo', 'barbera']", "magnesium has no value twice",
        "vintage is a column", "vintage has no empty values",
    }, failed.summary()
    over = by_check["alcohol in ..14"].details
    assert over["unexpected_count"] == int((frame["alcohol"] > 14).sum()) > 0
    assert all(value > 14 for value in over["partial_unexpected_list"])
    assert by_check["cultivar one of ['barolo', 'barbera']"].details["partial_unexpected_list"][0] == "grignolino"


def test_tp_train_refuses_from_footers_what_the_build_would_fail_on(tmp_path):
    from training_platform.datasets.files import check_source

    table = _ids(40)
    columns = FileColumns(label="y", features=["x"])
    (tmp_path / "good").mkdir()
    pq.write_table(table, tmp_path / "good" / "a.parquet")
    check_source(FileSource(uri=str(tmp_path / "good"), columns=columns))  # nothing to say

    (tmp_path / "mixed").mkdir()
    pq.write_table(table, tmp_path / "mixed" / "a.parquet")
    pq.write_table(table.set_column(1, "x", table.column("x").cast(pa.string())), tmp_path / "mixed" / "b.parquet")
    with pytest.raises(SnapshotError, match=r"conflicting schemas: column 'x' is double in .*a.parquet but string"):
        check_source(FileSource(uri=str(tmp_path / "mixed"), columns=columns))

    (tmp_path / "nulls").mkdir()
    labels = [None, None, *table.column("y").to_pylist()[2:]]
    pq.write_table(table.set_column(2, "y", pa.array(labels, pa.int64())), tmp_path / "nulls" / "a.parquet")
    with pytest.raises(SnapshotError, match=r"label column 'y' has 2 empty values; drop or fill those rows"):
        check_source(FileSource(uri=str(tmp_path / "nulls"), columns=columns))

    tiny_test = FileSplit(fractions={"train": 0.999, "test": 0.001})
    with pytest.raises(SnapshotError, match=r"dataset.split leaves test empty \(40 rows in all\)"):
        check_source(FileSource(uri=str(tmp_path / "good"), columns=columns, split=tiny_test))

    (tmp_path / "csv").mkdir()
    pa_csv.write_csv(table, tmp_path / "csv" / "a.csv")
    pa_csv.write_csv(table.drop_columns(["x"]), tmp_path / "csv" / "b.csv")
    with pytest.raises(SnapshotError, match=r"b.csv has columns \(none more\) and lacks x of .*a.csv"):
        check_source(FileSource(uri=str(tmp_path / "csv"), columns=columns))


def _reviews(rows: int = 60) -> pa.Table:
    """Short reviews with a sentiment, a numeric feature, and a tiny 'image' (bytes) per row."""
    words = ["good", "bad", "fine", "awful", "great", "dull"]
    return pa.table({
        "review_id": pa.array(range(rows), pa.int64()),
        "body": [f"{words[n % 6]} film, take {n}" for n in range(rows)],
        "stars": [float(n % 5) for n in range(rows)],
        "thumbnail": pa.array([bytes([137, 80, 78, 71, n % 256]) for n in range(rows)], pa.binary()),
        "sentiment": ["positive" if n % 6 in (0, 2, 4) else "negative" for n in range(rows)],
    })


def test_text_and_image_columns_are_kept_by_role_and_read_with_their_batches(tmp_path):
    from training_platform.train.split_data import SplitBatches

    reviews = _reviews()
    pq.write_table(reviews, tmp_path / "reviews.parquet")
    columns = FileColumns(label="sentiment", features=["stars"], text="body", image="thumbnail")
    source = FileSource(uri=str(tmp_path / "reviews.parquet"), columns=columns, split=FileSplit(key="review_id"))
    manifest = build_file_snapshot(source, tmp_path / "snap").manifest
    assert list(manifest.schema) == [ROW_ID, "stars", LABEL, "text", "image"]
    assert (manifest.schema["text"], manifest.schema["image"]) == ("string", "binary")
    assert manifest.feature_columns == ["stars"] and manifest.num_features == 1
    assert manifest.role_columns == ["text", "image"] and manifest.label_names == ["negative", "positive"]
    report = validate_snapshot(tmp_path / "snap", manifest.snapshot_id)
    assert report.success, report.summary()

    data = SplitBatches.load(tmp_path / "snap", manifest.snapshot_id, "train", batch_size=8, rank=0, world_size=1,
                             seed=3)
    batch = data[2]
    features, labels = batch  # unpacks as every batch does
    assert features.shape == (8, 1) and len(batch.text) == len(batch.image) == 8
    by_body = {row["body"]: row for row in reviews.to_pylist()}
    for text, image, label, stars in zip(batch.text, batch.image, labels.tolist(), features[:, 0].tolist(),
                                         strict=True):
        row = by_body[text]  # the same row's image, label and feature as its text
        assert image == row["thumbnail"] and data.label_names[label] == row["sentiment"]
        assert stars == pytest.approx(row["stars"] / 4)  # scaled by its range, 0..4

    # Text alone (features: []) is a snapshot too; the streamed reader says how to read it instead.
    text_only = FileSource(uri=str(tmp_path / "reviews.parquet"),
                           columns=FileColumns(label="sentiment", features=[], text="body"))
    only = build_file_snapshot(text_only, tmp_path / "snap").manifest
    assert only.feature_columns == [] and only.role_columns == ["text"]
    test = SplitBatches.load(tmp_path / "snap", only.snapshot_id, "test", batch_size=4, rank=0, world_size=1, seed=0)
    assert test.features.shape == (only.rows["test"], 0) and len(test.text) == only.rows["test"]
    from training_platform.train.split_data import SplitStream

    with pytest.raises(ValueError, match=r"has text: a streamed split reads numeric columns only; read it with "
                                         r"session.dataset\(split\)"):
        SplitStream.load(tmp_path / "snap", only.snapshot_id, "train", batch_size=4, rank=0, world_size=1, seed=0)


def test_role_columns_of_the_wrong_kind_are_refused_naming_the_column(tmp_path):
    from training_platform.datasets.files import check_source

    pq.write_table(_reviews(), tmp_path / "reviews.parquet")
    uri = str(tmp_path / "reviews.parquet")
    for columns, message in [
        (FileColumns(label="sentiment", text="stars"), r"dataset.columns.text 'stars' is double; it must hold strings"),
        (FileColumns(label="sentiment", image="stars"),
         r"dataset.columns.image 'stars' is double; it must hold each image's encoded bytes .* or its file's path"),
        (FileColumns(label="sentiment", text="caption"), r"dataset.columns.text: column 'caption' is not in"),
    ]:
        for step in (check_source, lambda source: build_file_snapshot(source, tmp_path / "snap")):
            with pytest.raises(SnapshotError, match=message):
                step(FileSource(uri=uri, columns=columns))
    with pytest.raises(ValidationError, match="column 'body' is both the text and the image"):
        FileColumns(label="sentiment", text="body", image="body")
    with pytest.raises(ValidationError, match="column 'body' is the text; take it out of features"):
        FileColumns(label="sentiment", text="body", features=["body", "stars"])
    with pytest.raises(ValidationError, match="dataset.columns.features is empty"):
        FileColumns(label="sentiment", features=[])


def test_a_model_template_is_refused_a_text_column_before_launch():
    from training_platform.errors import SpecError
    from training_platform.spec import parse_spec

    dataset = {"source": "./reviews.parquet", "columns": {"label": "sentiment", "text": "body"}}
    with pytest.raises(SpecError, match=r"dataset.columns.text: model templates read numeric features only; train "
                                        r"your own script \(entrypoint.script\), which reads the text as batch.text"):
        parse_spec({"name": "reviews", "team": "nlp", "owner": "ada", "dataset": dataset})


def test_images_named_by_path_are_read_into_the_snapshot_and_a_changed_image_is_a_new_snapshot(tmp_path):
    from training_platform.train.split_data import SplitBatches

    data = tmp_path / "pets"
    (data / "img").mkdir(parents=True)
    rows = []
    for n in range(30):
        (data / "img" / f"{n}.png").write_bytes(b"\x89PNG" + bytes([n]) * 8)
        rows.append({"file": f"img/{n}.png", "kind": "cat" if n % 2 else "dog"})
    pa_csv.write_csv(pa.Table.from_pylist(rows), data / "labels.csv")
    source = FileSource(uri=str(data / "labels.csv"), columns=FileColumns(label="kind", image="file"))
    first = build_file_snapshot(source, tmp_path / "snap")
    manifest = first.manifest
    assert manifest.schema["image"] == "binary" and manifest.role_columns == ["image"]
    test = SplitBatches.load(tmp_path / "snap", manifest.snapshot_id, "test", batch_size=2, rank=0, world_size=1,
                             seed=0)
    by_bytes = {(data / row["file"]).read_bytes(): row["kind"] for row in rows}
    assert len(test.image) == manifest.rows["test"]
    assert [by_bytes[image] for image in test.image] == [test.label_names[label] for label in test.labels.tolist()]
    assert build_file_snapshot(source, tmp_path / "snap").manifest == manifest  # unchanged: the same snapshot

    (data / "img" / "3.png").write_bytes(b"\x89PNG" + b"changed")  # the table's file is untouched
    assert build_file_snapshot(source, tmp_path / "snap").manifest.snapshot_id != manifest.snapshot_id

    (data / "img" / "4.png").unlink()
    with pytest.raises(SnapshotError, match=r"image 'img/4.png' cannot be read \(No such file or directory\); fix "
                                            r"the path \(relative to .*pets\) or the file"):
        build_file_snapshot(source, tmp_path / "snap")
    (data / "img" / "4.png").write_bytes(b"\x89PNG")
    with pytest.raises(SnapshotError, match=r"image 'img/0.png' is inside the platform's home"):
        build_file_snapshot(source, tmp_path / "snap", outside=data / "img")


def test_images_are_found_from_the_folder_the_source_names(tmp_path):
    from training_platform.datasets.files import _source_folder

    data = tmp_path / "data"
    (data / "2026").mkdir(parents=True)
    (data / "labels.csv").write_text("file,kind\n")
    assert _source_folder(str(data)) == data.resolve()  # a directory
    assert _source_folder(f"file://{data / 'labels.csv'}") == data.resolve()  # a file: its folder
    assert _source_folder(str(data / "20*" / "*.csv")) == data.resolve()  # a glob: the part before its pattern
