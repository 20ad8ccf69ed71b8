"""Snapshots of a team's own files: Parquet, CSV or JSON Lines, on disk (a file, a directory, a glob) or in S3.

A build reads each file once: its bytes are hashed, then parsed from the same buffer. Two records beside the
snapshots make a second build cheap:

    root/sources/<stat key>.json      the files' names, sizes and modification times (and the spec's columns
                                      and split) -> the snapshot: a match reads no file at all
    root/sources/<content key>.json   the files' hashes (and the same spec) -> the snapshot: files touched or
                                      copied but unchanged are hashed, not parsed, and nothing is written

A changed file gives a new snapshot; its shards are content addressed, so what did not change is not rewritten.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from training_platform.datasets.builder import parallel_map, write_tables
from training_platform.datasets.manifest import IMAGE, LABEL, ROW_ID, SPLITS, TEXT, SnapshotManifest
from training_platform.datasets.store import SnapshotRoot, get_object, load_manifest, put_object
from training_platform.errors import CheckpointError, SnapshotError
from training_platform.spec.file_source import FORMATS, RESERVED_COLUMNS, FileColumns, FileSplit

RECORDS = "sources"
SHARD_BYTES = 64 * 2**20
"""A shard's rows take about this much memory once read (Arrow), so a reader holds a few at a time."""
ROW_GROUP_ROWS = 65536
KEY_HASH_PARTS = 8  # string keys hash in this many parts, on a thread per core
_U53 = float(2**53)


@dataclass(frozen=True, kw_only=True)
class FileSource:
    """Where the files are, and how the spec reads them."""

    uri: str
    """A path, a directory, a glob, or ``s3://bucket/prefix`` (optionally ending in a glob)."""
    columns: FileColumns
    split: FileSplit = field(default_factory=FileSplit)

    def identity(self) -> dict:
        """Everything but the files that decides the snapshot's content."""
        return {
            "uri": self.uri,
            "columns": self.columns.model_dump(mode="json"),
            "split": self.split.model_dump(mode="json"),
        }


@dataclass(frozen=True)
class SourceFile:
    name: str
    """An absolute path, or the object's key under the bucket."""
    size: int
    modified: float
    read: Callable[[], bytes | pa.Buffer] = field(compare=False, repr=False)

    @property
    def format(self) -> str:
        return FORMATS[PurePosixPath(self.name).suffix.lower()]


@dataclass(frozen=True)
class FileSnapshot:
    manifest: SnapshotManifest
    files: list[SourceFile]
    parsed: bool
    """False where a record found the snapshot: no file was parsed and nothing was written."""


def build_file_snapshot(source: FileSource, root: SnapshotRoot, *, outside: Path | None = None) -> FileSnapshot:
    """Build (or find) the snapshot of a file source under root: unchanged files, the same snapshot.

    `outside`: a directory no file may be in (the platform's home: other teams' runs, checkpoints, settings).
    """
    files = list_source_files(source.uri)
    if outside is not None:
        _refuse_inside(files, source.uri, outside)
    _one_format(files, source.uri)
    stat_key = _key(source, [[file.name, file.size, file.modified] for file in files])
    found = _recorded(root, stat_key)
    if found is not None:
        return FileSnapshot(found, files, parsed=False)

    blobs = [file.read() for file in files]
    hashes = parallel_map(lambda blob: hashlib.sha256(blob).hexdigest(), blobs)
    content_key = _key(source, [[file.name, sha256] for file, sha256 in zip(files, hashes, strict=True)])
    found, recordable = _recorded(root, content_key), True
    if found is None:
        found, recordable = _write(source, _parsed(files, blobs, source.uri), root, content_key, outside)
    if recordable:  # images read by path are more than these files: such a snapshot is built again each time
        _record(root, content_key, found)
        _record(root, stat_key, found)
    return FileSnapshot(found, files, parsed=True)


def read_source_table(source: FileSource) -> pa.Table:
    """Every row of the source's files, as the files hold them (their own column names and values)."""
    files = list_source_files(source.uri)
    _one_format(files, source.uri)
    return _parsed(files, [file.read() for file in files], source.uri)


def _parsed(files: list[SourceFile], blobs: list[bytes | pa.Buffer], uri: str) -> pa.Table:
    """The files' rows in one table, parsed on a thread per core from the bytes already read (and emptied from
    `blobs`: what the table does not share is freed for the build to reuse)."""
    parts = parallel_map(_parse, blobs, files)
    blobs.clear()
    return _combine([(file.name, part) for file, part in zip(files, parts, strict=True)], uri)


def list_source_files(uri: str) -> list[SourceFile]:
    """The data files a URI names, sorted by name; hidden files and files of other types are left out."""
    files = _s3_files(uri) if uri.startswith("s3://") else _local_files(uri)
    files = [file for file in files if _is_data_file(file.name)]
    if not files:
        raise SnapshotError(
            f"dataset.source {uri} matches no data files; point it at a file, a directory or a glob of "
            f"{', '.join(sorted(set(FORMATS)))} files"
        )
    return sorted(files, key=lambda file: file.name)


def check_source(source: FileSource) -> None:
    """What can be told before a build, from files' footers and first blocks only: files exist, one format,
    schemas agree and hold the declared columns; for Parquet also no empty label and no empty split by position.
    JSON Lines and S3 objects are checked by the build."""
    files = list_source_files(source.uri)
    _one_format(files, source.uri)
    if files[0].name.startswith("s3://"):
        _check_readable(files[0], source.uri)  # listing may be allowed where reading is not
        return
    if files[0].format == "jsonl":
        return
    metadata = [_footer(file) for file in files] if files[0].format == "parquet" else []
    schemas = [m.schema.to_arrow_schema() for m in metadata] or [_csv_schema(file) for file in files]
    schema = _agreed_schema([(file.name, found) for file, found in zip(files, schemas, strict=True)], source.uri)
    _check_declared(source, schema.names)
    _check_role_types(source, schema)
    if not metadata:
        return
    nulls = sum(_null_count(m, source.columns.label) for m in metadata)
    if nulls:
        raise SnapshotError(_label_nulls(source, nulls))
    if source.split.column is None and source.split.key is None:
        _assign_by_hash(_position_hashes(sum(m.num_rows for m in metadata), source.split.seed), source.split)


def _footer(file: SourceFile) -> pq.FileMetaData:
    try:
        return pq.read_metadata(file.name)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SnapshotError(f"{file.name} cannot be read as parquet ({exc}); fix or remove the file") from None


def _csv_schema(file: SourceFile) -> pa.Schema:
    try:
        return pa_csv.open_csv(file.name).schema  # inferred from the first block, as the build's read starts
    except (pa.ArrowInvalid, OSError) as exc:
        raise SnapshotError(f"{file.name} cannot be read as csv ({exc}); fix or remove the file") from None


def _null_count(metadata: pq.FileMetaData, name: str) -> int:
    """Empty values of a top-level column by the row groups' statistics (0 where a writer kept none)."""
    columns = [metadata.schema.column(index).path for index in range(metadata.num_columns)]
    if name not in columns:
        return 0  # a nested column: left to the build
    column, total = columns.index(name), 0
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        total += stats.null_count if stats is not None and stats.has_null_count else 0
    return total


def _one_format(files: list[SourceFile], uri: str) -> None:
    formats = sorted({file.format for file in files})
    if len(formats) > 1:
        raise SnapshotError(
            f"dataset.source {uri} mixes file formats ({', '.join(formats)}); keep one format per source, "
            "or narrow it with a glob such as *.parquet"
        )


def _refuse_inside(files: list[SourceFile], uri: str, home: Path) -> None:
    home = home.resolve()
    for file in files:
        if not file.name.startswith("s3://") and home in Path(file.name).parents:
            raise SnapshotError(
                f"dataset.source {uri} reaches {file.name}, inside the platform's home {home}; keep your data "
                "outside it"
            )


def _is_data_file(name: str) -> bool:
    path = PurePosixPath(name)
    return path.suffix.lower() in FORMATS and not path.name.startswith((".", "_"))


def _local_files(uri: str) -> list[SourceFile]:
    text = uri.removeprefix("file://")
    path = Path(text).expanduser()
    if glob.has_magic(text):
        matches = [Path(match) for match in glob.glob(str(path), recursive=True)]
    elif path.is_dir():
        matches = list(path.rglob("*"))
    else:
        matches = [path] if path.exists() else []
    files = []
    for match in matches:
        if match.is_file():
            info = match.stat()
            resolved = match.resolve()
            read = functools.partial(_read_local, str(resolved))
            files.append(SourceFile(str(resolved), info.st_size, info.st_mtime_ns / 1e9, read))
    return files


def _read_local(path: str) -> pa.Buffer:
    """The file's bytes in Arrow's memory pool, which keeps and reuses what it frees (fresh pages cost more to
    fault in here than the copy itself)."""
    with pa.OSFile(path) as handle:
        return handle.read_buffer()


def _s3_files(uri: str) -> list[SourceFile]:
    from training_platform.checkpoints.s3 import S3Storage  # boto3 only for S3 sources

    parsed = urlparse(uri)
    parts = [part for part in parsed.path.split("/") if part]
    magic = _first_pattern(parts)
    if magic == len(parts) and parts and _is_data_file(parts[-1]):
        magic -= 1  # the URI names one object: list its folder, keep that name
    prefix, pattern = "/".join(parts[:magic]), "/".join(parts[magic:])
    try:
        storage = S3Storage.from_uri(f"s3://{parsed.netloc}/{prefix}")
        infos = storage.list_info("")
    except (CheckpointError, ValueError) as exc:
        raise SnapshotError(
            f"dataset.source {uri} cannot be listed ({exc}); check the bucket and prefix, and that the "
            "platform's S3 credentials may list and read them"
        ) from None
    base = f"{storage.uri}/"
    return [
        SourceFile(base + info.key, info.size, info.modified, lambda key=info.key: _s3_get(storage, key, uri))
        for info in infos
        if not pattern or fnmatch.fnmatchcase(info.key, pattern)
    ]


def _check_readable(file: SourceFile, uri: str) -> None:
    from training_platform.checkpoints.s3 import S3Storage

    folder, _, key = file.name.rpartition("/")
    try:
        S3Storage.from_uri(folder).stat(key)
    except (CheckpointError, ValueError) as exc:
        raise SnapshotError(
            f"dataset.source {uri}: {file.name} cannot be read ({exc}); check the platform's access to it"
        ) from None


def _s3_get(storage, key: str, uri: str) -> bytes:
    try:
        return storage.get(key)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise SnapshotError(
            f"dataset.source {uri}: {storage.uri}/{key} cannot be read ({exc}); check the platform's access to it"
        ) from None


def _key(source: FileSource, files: list[list]) -> str:
    body = json.dumps({"source": source.identity(), "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _recorded(root: SnapshotRoot, key: str) -> SnapshotManifest | None:
    data = get_object(root, f"{RECORDS}/{key}.json")
    if data is None:
        return None
    try:
        return load_manifest(root, json.loads(data)["snapshot_id"])
    except (SnapshotError, ValueError, KeyError, TypeError):
        return None  # the snapshot was deleted, or the record damaged: build it again


def _record(root: SnapshotRoot, key: str, manifest: SnapshotManifest) -> None:
    put_object(root, f"{RECORDS}/{key}.json", json.dumps({"snapshot_id": manifest.snapshot_id}).encode())


def _parse(data: bytes | pa.Buffer, file: SourceFile) -> pa.Table:
    buffer = pa.BufferReader(data)
    try:
        if file.format == "parquet":
            return pq.read_table(buffer)
        if file.format == "csv":
            return pa_csv.read_csv(buffer)
        return pa_json.read_json(buffer)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SnapshotError(f"{file.name} cannot be read as {file.format} ({exc}); fix or remove the file") from None


def _combine(tables: list[tuple[str, pa.Table]], uri: str) -> pa.Table:
    """One table of every file's rows, in file order; columns must agree (integers widen to floats)."""
    target = _agreed_schema([(name, table.schema) for name, table in tables], uri)
    try:
        return pa.concat_tables([table.select(target.names).cast(target) for _, table in tables])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SnapshotError(
            f"dataset.source {uri}: files cannot be combined ({exc}); make their columns agree"
        ) from None


def _agreed_schema(schemas: list[tuple[str, pa.Schema]], uri: str) -> pa.Schema:
    """The schema every file's rows take: the first file's columns, each of a type all files' values fit."""
    first_name, first = schemas[0]
    columns = first.names
    types: dict[str, list[tuple[str, pa.DataType]]] = {name: [] for name in columns}
    for name, schema in schemas:
        if set(schema.names) != set(columns):
            only_here = sorted(set(schema.names) - set(columns))
            only_first = sorted(set(columns) - set(schema.names))
            raise SnapshotError(
                f"dataset.source {uri}: files have conflicting schemas: {name} has columns "
                f"{', '.join(only_here) or '(none more)'} and lacks {', '.join(only_first) or '(none)'} of "
                f"{first_name}; give every file the same columns"
            )
        for column in columns:
            types[column].append((name, schema.field(column).type))
    return pa.schema([(column, _common_type(column, found, uri)) for column, found in types.items()])


def _common_type(column: str, found: list[tuple[str, pa.DataType]], uri: str) -> pa.DataType:
    kinds = {kind for _, kind in found if not pa.types.is_null(kind)}
    if len(kinds) <= 1:
        return kinds.pop() if kinds else pa.null()
    if all(pa.types.is_integer(kind) for kind in kinds):
        return pa.int64()
    if all(pa.types.is_integer(kind) or pa.types.is_floating(kind) for kind in kinds):
        return pa.float64()
    typed = [(name, kind) for name, kind in found if not pa.types.is_null(kind)]
    (name_a, type_a), (name_b, type_b) = next((a, b) for a in typed for b in typed if a[1] != b[1])
    raise SnapshotError(
        f"dataset.source {uri}: files have conflicting schemas: column {column!r} is {type_a} in {name_a} "
        f"but {type_b} in {name_b}; make the files agree"
    )


def _write(
    source: FileSource, table: pa.Table, root: SnapshotRoot, content_key: str, outside: Path | None
) -> tuple[SnapshotManifest, bool]:
    """The snapshot, and whether the source's files alone decide it (not where images are read by path)."""
    if table.num_rows == 0:
        raise SnapshotError(f"dataset.source {source.uri} has no rows; add data to its files")
    features = _feature_columns(source, table)
    roles = _role_columns(source, table, outside)
    by_path = _images_by_path(source, table.schema)
    labels, names = _labels(table, source)
    split_rows = _split_rows(table, source)
    feature_table = table.select(features)
    integers = all(pa.types.is_integer(kind) for kind in feature_table.schema.types)
    ranges = dict(zip(features, parallel_map(_range, feature_table.columns), strict=True))
    low, high = min((lo for lo, _ in ranges.values()), default=0), max((hi for _, hi in ranges.values()), default=0)
    kept = pa.Table.from_arrays([*feature_table.columns, *roles.values()], names=[*features, *roles])
    shard_rows = max(1, SHARD_BYTES // (kept.nbytes // table.num_rows + 16))  # + row_id and label
    # Each split's rows, in row order, by Arrow's filter: chunk by chunk, into memory its pool reuses (a gather
    # into fresh arrays spent more time in the kernel, faulting pages in, than copying).
    tables = {}
    for split, rows in split_rows.items():
        mask = pa.array(_mask(rows, table.num_rows))
        filtered = parallel_map(lambda column, mask=mask: column.filter(mask), kept.columns)
        own, by_role = filtered[: len(features)], filtered[len(features) :]
        tables[split] = pa.Table.from_arrays(
            [pa.array(rows.astype(np.int64)), *own, pa.array(labels[rows]), *by_role],
            names=[ROW_ID, *features, LABEL, *roles],
        )
    del table, feature_table, kept  # the caller keeps no reference: the encoders reuse its memory
    manifest = write_tables(
        root,
        tables,
        source=source.uri,
        source_sha256=content_key,
        num_classes=len(names) if names is not None else int(labels.max()) + 1,
        feature_min=int(low) if integers else float(low),
        feature_max=int(high) if integers else float(high),
        split_seed=source.split.seed,
        label_names=names,
        feature_ranges=ranges,
        shard_rows=shard_rows,
        row_group_rows=min(ROW_GROUP_ROWS, shard_rows),
        dictionary=False,  # a team's columns are mostly measurements: a dictionary would only be tried and dropped
    )
    return manifest, not by_path


def _mask(rows: np.ndarray, size: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[rows] = True
    return mask


def _range(column: pa.ChunkedArray) -> tuple[float, float]:
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    # A column of nulls only has no range (its expectations refuse it).
    return (0.0, 0.0) if low is None else (float(low), float(high))


def _check_declared(source: FileSource, found: list[str]) -> None:
    columns, split = source.columns, source.split
    declared = {"dataset.columns.label": [columns.label], "dataset.columns.features": columns.features or []}
    declared |= {"dataset.columns.text": [columns.text] if columns.text else []}
    declared |= {"dataset.columns.image": [columns.image] if columns.image else []}
    declared |= {"dataset.split.column": [split.column] if split.column else []}
    declared |= {"dataset.split.key": [split.key] if split.key else []}
    for where, names in declared.items():
        missing = [name for name in names if name not in found]
        if missing:
            raise SnapshotError(
                f"{where}: column {', '.join(map(repr, missing))} is not in {source.uri}; its columns are "
                f"{', '.join(found)}"
            )


def _feature_columns(source: FileSource, table: pa.Table) -> list[str]:
    columns, split = source.columns, source.split
    _check_declared(source, table.column_names)
    others = {columns.label, split.column, split.key, columns.text, columns.image}
    features = columns.features if columns.features is not None else [
        name for name in table.column_names if name not in others and _numeric(table.schema.field(name).type)
    ]
    for name in features:
        if name in RESERVED_COLUMNS:
            raise SnapshotError(
                f"{source.uri}: feature column {name!r} has a name the snapshot keeps for its own; rename it in "
                "the files, or leave it out with dataset.columns.features"
            )
        kind = table.schema.field(name).type
        if not _numeric(kind):
            raise SnapshotError(
                f"{source.uri}: feature column {name!r} is {kind}, not numeric; list the numeric features in "
                "dataset.columns.features"
            )
    if not features and columns.text is None and columns.image is None:
        raise SnapshotError(
            f"{source.uri} has no numeric columns besides the label; add features to the files, or name a text or "
            "image column in dataset.columns"
        )
    return features


def _role_columns(source: FileSource, table: pa.Table, outside: Path | None) -> dict[str, pa.ChunkedArray]:
    """The text and image columns the spec names, by role, as string and binary (images given by path are read)."""
    _check_role_types(source, table.schema)
    columns = {role: table.column(name) for role, name in _roles(source).items()}
    if TEXT in columns:
        columns[TEXT] = columns[TEXT].cast(pa.string())
    if IMAGE in columns:
        image = columns[IMAGE]
        by_path = _images_by_path(source, table.schema)
        columns[IMAGE] = _read_images(image, source.uri, outside) if by_path else image.cast(pa.binary())
    return columns


def _images_by_path(source: FileSource, schema: pa.Schema) -> bool:
    """Whether the image column holds paths (strings) rather than the images' bytes."""
    return source.columns.image is not None and _is_text(schema.field(source.columns.image).type)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _roles(source: FileSource) -> dict[str, str]:
    named = {TEXT: source.columns.text, IMAGE: source.columns.image}
    return {role: name for role, name in named.items() if name is not None}


def _check_role_types(source: FileSource, schema: pa.Schema) -> None:
    for role, name in _roles(source).items():
        kind = schema.field(name).type
        text = _is_text(kind)
        if role == TEXT and not text:
            raise SnapshotError(f"{source.uri}: dataset.columns.text {name!r} is {kind}; it must hold strings")
        if role == IMAGE and not (text or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise SnapshotError(
                f"{source.uri}: dataset.columns.image {name!r} is {kind}; it must hold each image's encoded bytes "
                "(PNG, JPEG: a binary column) or its file's path"
            )
        if role == IMAGE and text and source.uri.startswith("s3://"):
            raise SnapshotError(
                f"{source.uri}: dataset.columns.image {name!r} holds paths; an S3 source's images must be in its "
                "files as bytes (a binary column)"
            )


def _read_images(paths: pa.ChunkedArray, uri: str, outside: Path | None) -> pa.Array:
    """Each image's bytes, by its path (relative to the source's folder, or absolute), so the snapshot holds the
    images themselves: a path could later name another file."""
    base = _source_folder(uri)
    home = outside.resolve() if outside is not None else None

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None  # an empty value: the snapshot's suite counts it
        resolved = (base / path).expanduser().resolve()
        if home is not None and (resolved == home or home in resolved.parents):
            raise SnapshotError(f"{uri}: image {path!r} is inside the platform's home {home}; keep images outside it")
        try:
            return resolved.read_bytes()
        except OSError as exc:
            raise SnapshotError(
                f"{uri}: image {path!r} cannot be read ({exc.strerror}); fix the path (relative to {base}) or the file"
            ) from None

    return pa.array(parallel_map(read, paths.to_pylist(), threads=8), pa.binary())  # file reads: I/O, not CPU


def _source_folder(uri: str) -> Path:
    """The folder a local source names: a directory itself, a file's folder, a glob's fixed part."""
    text = uri.removeprefix("file://")
    path = Path(text).expanduser()
    if glob.has_magic(text):
        return Path(*path.parts[: _first_pattern(path.parts)]).resolve()
    return (path if path.is_dir() else path.parent).resolve()


def _first_pattern(parts: Sequence[str]) -> int:
    """The index of the first of a path's PARTS that is a glob pattern; len(PARTS) where none is."""
    return next((index for index, part in enumerate(parts) if glob.has_magic(part)), len(parts))


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _labels(table: pa.Table, source: FileSource) -> tuple[np.ndarray, list[str] | None]:
    """Integer class ids; string labels become their index in the sorted names."""
    name = source.columns.label
    column = table.column(name)
    if column.null_count:
        first = pc.index(pc.is_null(column), True).as_py()
        raise SnapshotError(_label_nulls(source, column.null_count, first))
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
        column = column.cast(pa.string())
        names = sorted(pc.unique(column).to_pylist())
        return pc.index_in(column, value_set=pa.array(names)).to_numpy(zero_copy_only=False).astype(np.int64), names
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        labels = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
        if labels.min() < 0:
            raise SnapshotError(f"{source.uri}: label column {name!r} has negative values; class ids start at 0")
        return labels, None
    raise SnapshotError(
        f"{source.uri}: label column {name!r} is {kind}; labels must be integer class ids or strings"
    )


def _label_nulls(source: FileSource, count: int, first: int | None = None) -> str:
    where = f" (the first in row {first})" if first is not None else ""
    return (
        f"{source.uri}: label column {source.columns.label!r} has {count} empty values{where}; "
        "drop or fill those rows"
    )


def _split_rows(table: pa.Table, source: FileSource) -> dict[str, np.ndarray]:
    split = source.split
    if split.column is not None:
        values = table.column(split.column).cast(pa.string())
        found = set(pc.unique(values).to_pylist())
        unknown = sorted(str(value) for value in found - set(SPLITS))
        if unknown:
            raise SnapshotError(
                f"dataset.split.column {split.column!r} has values {', '.join(unknown)}; use train, validation or test"
            )
        names = [name for name in SPLITS if name in found]
        array = values.to_numpy(zero_copy_only=False)
        rows = {name: np.flatnonzero(array == name) for name in names}
        if "train" not in rows:
            raise SnapshotError(f"dataset.split.column {split.column!r} marks no train rows; mark some")
        return rows
    return _assign_by_hash(_key_hashes(table, source), split)


def _assign_by_hash(hashes: np.ndarray, split: FileSplit) -> dict[str, np.ndarray]:
    """Rows per split by where each row's hash falls among the fractions; no split may be left empty."""
    names = [name for name in SPLITS if name in split.fractions]
    bounds = np.cumsum([split.fractions[name] for name in names])[:-1]
    position = (hashes >> np.uint64(11)).astype(np.float64) / _U53
    assigned = np.searchsorted(bounds, position, side="right")
    rows = {name: np.flatnonzero(assigned == index) for index, name in enumerate(names)}
    empty = [name for name, members in rows.items() if not len(members)]
    if empty:
        raise SnapshotError(
            f"dataset.split leaves {', '.join(empty)} empty ({len(hashes)} rows in all); raise its fraction, "
            "add rows, or leave the split out of dataset.split.fractions"
        )
    return rows


def _position_hashes(rows: int, seed: int) -> np.ndarray:
    return _splitmix64(np.arange(rows, dtype=np.uint64) ^ _splitmix64(np.uint64(seed)))


def _key_hashes(table: pa.Table, source: FileSource) -> np.ndarray:
    """A 64-bit hash per row of the seed and the row's key (its position where no key column is named)."""
    seed, key = source.split.seed, source.split.key
    if key is None:
        return _position_hashes(table.num_rows, seed)
    column = table.column(key)
    if column.null_count:
        raise SnapshotError(f"dataset.split.key {key!r} has {column.null_count} empty values; every row needs a key")
    if pa.types.is_integer(column.type):
        values = column.cast(pa.int64()).to_numpy(zero_copy_only=False).view(np.uint64)
        return _splitmix64(values ^ _splitmix64(np.uint64(seed)))
    # Other keys (strings, mostly): SipHash of their text, keyed by the seed (pandas' hash_array, in C). It
    # hashes without the GIL once it has each value's bytes: parts on threads take 30% less time (6.7M keys).
    from pandas.util import hash_array

    # Each part becomes Python bytes (hash_array hashes a string's UTF-8 bytes: the same hashes, without a str and
    # its encoded copy per value) on its own thread, and drops them once hashed.
    hash_key = f"{seed:016d}"[-16:]
    bounds = np.linspace(0, len(column), max(1, min(KEY_HASH_PARTS, len(column) // 100_000)) + 1).astype(int)

    def hashed(start: int, stop: int) -> np.ndarray:
        values = column.slice(start, stop - start).cast(pa.string()).cast(pa.binary()).to_numpy(zero_copy_only=False)
        return hash_array(values, hash_key=hash_key, categorize=False)

    return np.concatenate(parallel_map(hashed, bounds[:-1], bounds[1:]))


def _splitmix64(values: np.ndarray | np.uint64) -> np.ndarray:
    """SplitMix64's finalizer: a fixed, well-mixed 64-bit hash that no library upgrade can change."""
    with np.errstate(over="ignore"):
        z = np.asarray(values, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
