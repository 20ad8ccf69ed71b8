"""Dated sources: a landing directory of daily drops, and snapshots of the data "as of" a day.

A landing directory holds one file per day:

    landing/<YYYY-MM-DD>.parquet (or .csv)   a drop: a batch of rows, e.g. pixel_0..pixel_63 and label

The snapshot as of day D holds every drop dated on or before D, in date order, and is written
by the same content-addressed builder as every other snapshot: the same drops give the same
snapshot id, a changed drop gives a new id and the old snapshot's files stay as they were.

Each drop is split on its own (stratified, seeded), so a row keeps its split on every later
day: a model trained as of D is never gated on test rows that an earlier model trained on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from training_platform.datasets.builder import SPLIT_SEED, assign_splits, build_snapshot, encode_parquet, write_snapshot
from training_platform.datasets.manifest import LABEL, SnapshotManifest
from training_platform.datasets.sources import RawSource, load_source
from training_platform.datasets.store import SnapshotRoot, file_sha256
from training_platform.errors import SnapshotError

LANDING_DIR = "landing"
"""Default landing directory, under the platform home (``$TP_HOME/landing``)."""
_DROP_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})\.(parquet|csv)$")


@dataclass(frozen=True, kw_only=True)
class DatedSource:
    """A source whose rows arrive as daily drops; what every drop must look like."""

    name: str
    """Registered name, as used in ``dataset.source`` and recorded in manifests."""
    num_features: int
    feature_prefix: str
    """Feature columns are ``<prefix>_0 .. <prefix>_<num_features - 1>``."""
    feature_type: pa.DataType
    """Features are cast to this type (exactly, or the drop is refused), so CSV and Parquet drops agree."""
    num_classes: int
    feature_min: int
    feature_max: int

    @property
    def feature_columns(self) -> list[str]:
        return [f"{self.feature_prefix}_{index}" for index in range(self.num_features)]


DIGITS_DAILY = DatedSource(
    name="digits_daily",
    num_features=64,
    feature_prefix="pixel",
    feature_type=pa.int16(),
    num_classes=10,
    feature_min=0,
    feature_max=16,
)
DATED_SOURCES: dict[str, DatedSource] = {DIGITS_DAILY.name: DIGITS_DAILY}


@dataclass(frozen=True)
class Drop:
    """One day's file in the landing directory, identified by the hash of its bytes."""

    day: date
    path: Path
    sha256: str

    def as_dict(self) -> dict[str, str]:
        return {"day": self.day.isoformat(), "file": self.path.name, "sha256": self.sha256}


@dataclass(frozen=True)
class DatedSnapshot:
    """A built snapshot and the drops it holds (empty for un-dated sources)."""

    manifest: SnapshotManifest
    as_of: date | None
    drops: tuple[Drop, ...] = ()


def is_dated_source(name: str | None) -> bool:
    return name in DATED_SOURCES


def dated_source(name: str) -> DatedSource:
    try:
        return DATED_SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(DATED_SOURCES))
        raise SnapshotError(f"{name!r} is not a dated source; dated sources: {known}") from None


def default_landing(home_root: Path) -> Path:
    """The landing directory of a platform home."""
    return Path(home_root) / LANDING_DIR


def list_drops(landing: Path) -> list[Drop]:
    """Every drop in the landing directory, oldest day first; other files (temporary ones too) are ignored."""
    landing = Path(landing)
    if not landing.is_dir():
        return []
    by_day: dict[date, list[Path]] = {}
    for path in landing.iterdir():
        match = _DROP_NAME.match(path.name)
        if not match or not path.is_file():
            continue
        try:
            day = date.fromisoformat(match.group(1))
        except ValueError:
            continue  # 2026-13-01.parquet is not a day; leave it for a person to rename
        by_day.setdefault(day, []).append(path)
    drops = []
    for day in sorted(by_day):
        paths = sorted(by_day[day])
        if len(paths) > 1:
            raise SnapshotError(
                f"landing directory {landing} has {len(paths)} drops for {day}: "
                f"{', '.join(p.name for p in paths)}; keep one file per day"
            )
        drops.append(Drop(day=day, path=paths[0], sha256=file_sha256(paths[0])))
    return drops


def drops_as_of(landing: Path, as_of: date) -> list[Drop]:
    """The drops a snapshot as of `as_of` holds: every drop dated on or before it."""
    return [drop for drop in list_drops(landing) if drop.day <= as_of]


def read_drop(drop: Drop, source: DatedSource) -> tuple[np.ndarray, np.ndarray]:
    """A drop's features and labels, checked against the source's columns and cast to its types."""
    try:
        table = pq.read_table(drop.path) if drop.path.suffix == ".parquet" else pa_csv.read_csv(drop.path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SnapshotError(f"drop {drop.path} cannot be read ({exc}); replace it with a valid file") from None
    missing = [name for name in [*source.feature_columns, LABEL] if name not in table.column_names]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise SnapshotError(
            f"drop {drop.path} lacks columns {shown}; a {source.name} drop needs "
            f"{source.feature_prefix}_0..{source.num_features - 1} and {LABEL}"
        )
    try:
        features = np.stack(
            [table.column(name).cast(source.feature_type).to_numpy() for name in source.feature_columns], axis=1
        )
        labels = table.column(LABEL).cast(pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SnapshotError(
            f"drop {drop.path} has values that are not {source.feature_type} features or integer labels ({exc}); "
            "fix the drop"
        ) from None
    return features, labels


def build_dated_snapshot(
    source: str, root: SnapshotRoot, landing: Path, as_of: date, *, seed: int = SPLIT_SEED
) -> DatedSnapshot:
    """Build (or find) the snapshot of `source` as of `as_of`: every drop dated on or before that day."""
    spec = dated_source(source)
    drops = drops_as_of(landing, as_of)
    if not drops:
        raise SnapshotError(
            f"no {source} drops dated on or before {as_of} in {landing}; add {landing}/<YYYY-MM-DD>.parquet "
            "(or seed it: `tp retrain` seeds an empty landing directory)"
        )
    features, labels, split_rows, offset = [], [], {}, 0
    for drop in drops:
        drop_features, drop_labels = read_drop(drop, spec)
        for split, rows in assign_splits(drop_labels, seed=seed).items():
            split_rows.setdefault(split, []).append(rows + offset)
        features.append(drop_features)
        labels.append(drop_labels)
        offset += len(drop_labels)
    raw = RawSource(
        name=spec.name,
        features=np.concatenate(features),
        labels=np.concatenate(labels),
        num_classes=spec.num_classes,
        feature_min=spec.feature_min,
        feature_max=spec.feature_max,
        feature_prefix=spec.feature_prefix,
    )
    rows = {split: np.concatenate(parts) for split, parts in split_rows.items()}
    manifest = write_snapshot(root, raw, rows, seed=seed)
    return DatedSnapshot(manifest=manifest, as_of=as_of, drops=tuple(drops))


def build_snapshot_as_of(source: str, root: SnapshotRoot, *, as_of: date, landing: Path) -> DatedSnapshot:
    """The snapshot of any registered source as of a day; an un-dated source is the same every day."""
    if is_dated_source(source):
        return build_dated_snapshot(source, root, landing, as_of)
    return DatedSnapshot(manifest=build_snapshot(source, root), as_of=None)


def seed_landing(landing: Path, start: date, days: int, *, source: str = "sklearn_digits") -> list[Drop]:
    """Split a bundled source into `days` daily drops from `start` (deterministic); existing files are kept."""
    if days < 1:
        raise SnapshotError(f"seed_landing: days must be >= 1, got {days}")
    raw = load_source(source)
    landing = Path(landing)
    landing.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(np.array_split(np.arange(len(raw.labels)), days)):
        path = landing / f"{start + timedelta(days=index)}.parquet"
        if path.exists():
            continue  # never overwrite a drop: a changed drop must be a deliberate act
        columns = {f"{raw.feature_prefix}_{i}": pa.array(raw.features[rows, i]) for i in range(raw.features.shape[1])}
        columns[LABEL] = pa.array(raw.labels[rows].astype(np.int64))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(encode_parquet(pa.table(columns)))
        tmp.replace(path)  # a sensor never sees half a drop under its final name
    return list_drops(landing)

