"""DCP's own file reader and load planner, minus the two places where they unpickle what they read.

`FileSystemReader.read_metadata` unpickles ``.metadata`` with `pickle.load`, and
`DefaultLoadPlanner.load_bytes` loads every non-tensor item with ``torch.load(weights_only=False)``:
either runs whatever code a crafted checkpoint holds. Here ``.metadata`` is unpickled with an
allow-list of DCP's own metadata classes, and items with ``torch.load(weights_only=True)``.
Tensors DCP already reads with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from training_platform.errors import CheckpointError

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
        "StorageMeta",
        "MetadataIndex",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch's layouts by name
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id, the directory it was saved to
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata and nothing else: any other global is refused, so no code runs."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _METADATA_CLASSES or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, whose ``.metadata`` may hold only DCP's metadata classes, and which reads each file's
    items in the order they lie in it."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        # DCP reads a file's items in the plan's order (its own TODO: "sort by offset"); a file read from the
        # store's chunks (dcp_chunks.StoredFiles) is then read front to back, each chunk fetched once.
        def where(item: ReadItem) -> tuple[str, int]:
            info = self.storage_data[item.storage_index]
            return info.relative_path, info.offset

        return super().read_data(dataclasses.replace(plan, items=sorted(plan.items, key=where)), planner)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"its {Path(path).name} refers to {exc}, which DCP metadata never holds: it is crafted or "
                "damaged, and is not unpickled"
            ) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def refused_global(exc: pickle.UnpicklingError) -> str:
    """What a weights_only load refused, without torch's advice to allow it."""
    text = str(exc)
    if named := re.search(r"Unsupported global: GLOBAL ([\w.]+)", text):
        return f"it refers to {named.group(1)}"
    detail = next((line for line in text.splitlines() if "WeightsUnpickler error" in line), text.split("\n")[0])
    return detail.strip().split(". ")[0]


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, whose non-tensor items may hold only plain data."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            item = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"DCP item {read_item.dest_index.fqn!r} holds an object this build does not unpickle "
                f"({refused_global(exc)}): the checkpoint is crafted, or holds more than tensors and plain data"
            ) from None
        # The parent stores the item where it belongs (flattened or not) by unpickling `value` with
        # weights_only=False: give it bytes serialized here, from what the safe load returned.
        plain = io.BytesIO()
        torch.save(item, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)
