"""Checkpoint store: atomic, hash-verified, content-addressed checkpoints.

Names are imported on first use, so the background writer process (which needs only the
torch-free writer, storage and manifest modules) starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncCheckpointer": "async_saver",
    "SaveResult": "async_saver",
    "CheckpointManifest": "manifest",
    "ChunkRef": "manifest",
    "CheckpointStore": "store",
    "Restored": "store",
    "SaveStats": "store",
    "open_store": "store",
    "RetentionPolicy": "retention",
    "CheckpointCadence": "interval",
    "IntervalChoice": "interval",
    "young_daly_interval": "interval",
}

__all__ = [
    "AsyncCheckpointer",
    "CheckpointCadence",
    "CheckpointManifest",
    "CheckpointStore",
    "ChunkRef",
    "IntervalChoice",
    "Restored",
    "RetentionPolicy",
    "SaveResult",
    "SaveStats",
    "open_store",
    "young_daly_interval",
]

if TYPE_CHECKING:
    from training_platform.checkpoints.async_saver import AsyncCheckpointer, SaveResult
    from training_platform.checkpoints.interval import CheckpointCadence, IntervalChoice, young_daly_interval
    from training_platform.checkpoints.manifest import CheckpointManifest, ChunkRef
    from training_platform.checkpoints.retention import RetentionPolicy
    from training_platform.checkpoints.store import CheckpointStore, Restored, SaveStats, open_store


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
