"""Dataset snapshots: immutable, content-addressed Parquet shards plus a manifest, and their validation.

Importing this package is cheap: Great Expectations is imported only inside `validate_snapshot`.
"""

from training_platform.datasets.builder import build_snapshot
from training_platform.datasets.manifest import ShardRef, SnapshotManifest
from training_platform.datasets.reader import read_split
from training_platform.datasets.sources import register_source, source_names
from training_platform.datasets.store import list_snapshots, load_manifest
from training_platform.datasets.validation import ValidationReport, validate_snapshot

__all__ = [
    "ShardRef",
    "SnapshotManifest",
    "ValidationReport",
    "build_snapshot",
    "list_snapshots",
    "load_manifest",
    "read_split",
    "register_source",
    "source_names",
    "validate_snapshot",
]
