"""A fingerprint of model weights that is equal iff every tensor is bitwise equal."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def weights_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of each tensor, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
