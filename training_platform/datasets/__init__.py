"""Dataset snapshots: immutable, content-addressed Parquet shards plus a manifest, and their validation.

Importing this package is cheap: each name below is imported from its module when it is first used, so a module that
imports the package and uses none of them (the CLI's commands) does not load pyarrow and numpy (about 0.3 s of
every command's start); Great Expectations is imported only inside `validate_snapshot`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training_platform.datasets.builder import build_snapshot
    from training_platform.datasets.manifest import ShardRef, SnapshotManifest
    from training_platform.datasets.reader import read_split
    from training_platform.datasets.sources import register_source, source_names
    from training_platform.datasets.store import list_snapshots, load_manifest
    from training_platform.datasets.validation import ValidationReport, validate_snapshot

_MODULE_OF = {
    "build_snapshot": "builder",
    "ShardRef": "manifest",
    "SnapshotManifest": "manifest",
    "read_split": "reader",
    "register_source": "sources",
    "source_names": "sources",
    "list_snapshots": "store",
    "load_manifest": "store",
    "ValidationReport": "validation",
    "validate_snapshot": "validation",
}

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


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # the next use finds it without this function
    return value
