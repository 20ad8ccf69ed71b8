"""Turn a nested training state into tensors plus a small skeleton, and back.

The skeleton holds only plain containers and scalars and is loaded with
``torch.load(weights_only=True)``, so restoring a checkpoint never unpickles arbitrary code.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from training_platform.checkpoints.writer import Blob

_TENSOR = "__tp_tensor__"
_NDARRAY = "__tp_ndarray__"


def flatten_state(state: Any, *, to_cpu: bool = True) -> tuple[bytes, list[torch.Tensor]]:
    """Return (skeleton bytes, tensors) where the skeleton refers to tensors by index.

    `to_cpu=False` leaves accelerator tensors where they are, for a caller that copies them
    into its own (pinned) buffer in one step.
    """
    tensors: list[torch.Tensor] = []

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            tensors.append(node.detach().cpu() if to_cpu else node.detach())
            return {_TENSOR: len(tensors) - 1}
        if isinstance(node, np.ndarray):
            tensors.append(torch.from_numpy(np.ascontiguousarray(node)))
            return {_NDARRAY: len(tensors) - 1}
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list | tuple):
            items = [walk(value) for value in node]
            return items if isinstance(node, list) else tuple(items)
        if node is None or isinstance(node, bool | int | float | str | bytes):
            return node
        raise TypeError(
            f"cannot checkpoint a {type(node).__name__}: use tensors, numpy arrays, dicts, lists, "
            "tuples and plain scalars"
        )

    buffer = io.BytesIO()
    torch.save(walk(state), buffer)
    return buffer.getvalue(), tensors


def read_skeleton(skeleton: bytes) -> Any:
    """The skeleton's tree of containers and scalars (weights_only: nothing in it is unpickled as code)."""
    return torch.load(io.BytesIO(skeleton), weights_only=True)


def unflatten_state(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """SKELETON: read_skeleton's tree, its tensor references replaced by TENSORS."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {_TENSOR}:
                return tensors[node[_TENSOR]]
            if set(node) == {_NDARRAY}:
                return tensors[node[_NDARRAY]].numpy()
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value) for value in node]
        if isinstance(node, tuple):
            return tuple(walk(value) for value in node)
        return node

    return walk(skeleton)


def tensors_at_same_paths(skeleton: Any, into: Any) -> dict[int, torch.Tensor]:
    """The tensors of `into` (a state shaped like the saved one) by the index of the saved tensor at the same path.

    A path `into` lacks, or holds something else at, is left out: that tensor is read into new memory.
    """
    found: dict[int, torch.Tensor] = {}

    def walk(node: Any, target: Any) -> None:
        if isinstance(node, dict) and set(node) == {_TENSOR}:
            if isinstance(target, torch.Tensor):
                found[node[_TENSOR]] = target
        elif isinstance(node, dict) and isinstance(target, dict):
            for key, value in node.items():
                if key in target:
                    walk(value, target[key])
        elif isinstance(node, list | tuple) and isinstance(target, list | tuple):
            for value, other in zip(node, target, strict=False):
                walk(value, other)

    walk(skeleton, into)
    return found


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as a flat memoryview; no copy when it is contiguous on the CPU."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def tensor_blob(tensor: torch.Tensor) -> Blob:
    return Blob(data=byte_view(tensor), dtype=dtype_name(tensor.dtype), shape=list(tensor.shape))


def tensor_from_bytes(data: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """Reinterpret a flat uint8 tensor as `dtype` and `shape` (no copy)."""
    if data.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    return data.view(dtype).reshape(shape)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in checkpoint manifest")
    return dtype
