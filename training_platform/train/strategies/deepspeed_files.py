"""DeepSpeed's checkpoint files, read without running code that a crafted one could hold.

DeepSpeed loads them with ``torch.load(weights_only=False)``. This engine loads them with
``weights_only=True``, which allows tensors, containers and scalars, plus the three plain classes
that ZeRO's files hold besides (checked with DeepSpeed 0.19, stages 1-3, with and without
offload): unpickling them sets attributes and runs nothing.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from training_platform.checkpoints.dcp_safe import refused_global
from training_platform.errors import CheckpointError

DEEPSPEED_GLOBALS = [LossScaler, ZeroStageEnum, fragment_address]


class SafeCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine (same files, same saves), loading with weights_only."""

    def load(self, path: str, map_location: Any = None) -> Any:
        try:
            with torch.serialization.safe_globals(DEEPSPEED_GLOBALS):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"DeepSpeed file {Path(path).name} holds an object this build does not unpickle "
                f"({refused_global(exc)}): the checkpoint is crafted, or was written by an older build"
            ) from None
