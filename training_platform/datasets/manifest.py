"""The snapshot manifest: written last, it is what makes a snapshot visible.

The snapshot id is the sha256 of the manifest's canonical JSON without the id itself. The
manifest carries no timestamp, so the same source always gives the same id, and an edited
manifest no longer matches its id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from training_platform.errors import SnapshotError

FORMAT_VERSION = 1
ROW_ID = "row_id"
LABEL = "label"
TEXT = "text"
IMAGE = "image"
ROLE_COLUMNS = (TEXT, IMAGE)
"""Columns a file source keeps by role beside its numeric features: a row's text, an image's encoded bytes."""
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class ShardRef:
    """One immutable Parquet shard, addressed by the sha256 of its bytes."""

    path: str
    """Relative to the snapshot root, e.g. ``shards/<sha256>.parquet``."""
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class SnapshotManifest:
    """What a snapshot holds: schema, splits, and a verifiable reference to every shard."""

    source: str
    """Registered source name the snapshot was built from, or the URI of its files."""
    source_sha256: str
    """Hash of the raw source values, so two snapshots of the same data can be recognized."""
    schema: dict[str, str]
    """Column name -> Arrow type name, in column order."""
    num_features: int
    num_classes: int
    feature_min: int | float
    """Smallest valid feature value (validation bound)."""
    feature_max: int | float
    """Largest valid feature value; readers divide by it to scale features to [0, 1]."""
    split_seed: int
    """Seed of the deterministic stratified split."""
    splits: dict[str, list[ShardRef]]
    """Split name -> its shards, in row order."""
    rows: dict[str, int]
    """Split name -> row count."""
    label_names: list[str] | None = None
    """A file source's string labels, label i naming class i; None where labels were integers."""
    feature_ranges: dict[str, tuple[float, float]] | None = None
    """A file source's (min, max) per feature: readers scale each feature to [0, 1] by its own range (a team's
    columns differ by orders of magnitude); None for the built-in sources, scaled by feature_max."""
    format_version: int = FORMAT_VERSION
    snapshot_id: str = ""
    """sha256 of the canonical manifest without this field; empty until sealed."""

    @property
    def feature_columns(self) -> list[str]:
        return [name for name in self.schema if name not in (ROW_ID, LABEL, *ROLE_COLUMNS)]

    @property
    def role_columns(self) -> list[str]:
        """The text and image columns this snapshot holds (a file source's, by `dataset.columns`)."""
        return [name for name in ROLE_COLUMNS if name in self.schema]

    @property
    def split_names(self) -> list[str]:
        return list(self.splits)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def total_bytes(self) -> int:
        return sum(shard.bytes for _, shard in self.shards())

    def shards(self) -> Iterator[tuple[str, ShardRef]]:
        for split, refs in self.splits.items():
            for ref in refs:
                yield split, ref

    def content_hash(self) -> str:
        body = self.to_dict()
        del body["snapshot_id"]
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def sealed(self) -> SnapshotManifest:
        return dataclasses.replace(self, snapshot_id=self.content_hash())

    def to_dict(self) -> dict[str, Any]:
        body = _ADAPTER.dump_python(self, mode="json")
        # Fields added after format 1 are left out while unset: a manifest written before them keeps its id.
        for name in _ADDED_FIELDS:
            if body[name] is None:
                del body[name]
        return body

    def to_json(self) -> str:
        """The manifest file's text: key order kept (splits read train, validation, test), stable bytes."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, origin: str) -> SnapshotManifest:
        try:
            return _ADAPTER.validate_json(text)
        except ValidationError as exc:
            raise SnapshotError(
                f"manifest {origin} is not a valid snapshot manifest ({exc.error_count()} errors, first: "
                f"{exc.errors()[0]['msg']}); delete it and rebuild the snapshot"
            ) from None

    def summary(self) -> dict[str, Any]:
        """The figures shown in Dagster metadata and the CLI."""
        return {
            "snapshot_id": self.snapshot_id,
            "source": self.source,
            "source_sha256": self.source_sha256,
            "rows": dict(self.rows),
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "shards": sum(1 for _ in self.shards()),
            "bytes": self.total_bytes,
        }


_ADAPTER = TypeAdapter(SnapshotManifest)
_ADDED_FIELDS = ("label_names", "feature_ranges")
