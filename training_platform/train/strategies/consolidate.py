"""One process, no process group: the full model weights of any strategy's checkpoint.

Evaluation, registration and `tp` read checkpoints outside the training job. DDP checkpoints
hold the replicated state; FSDP checkpoints are DCP shards, merged here by DCP itself; DeepSpeed
checkpoints are consolidated with DeepSpeed's own ``zero_to_fp32`` (every ZeRO stage).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from training_platform.checkpoints import CheckpointManifest, CheckpointStore
from training_platform.errors import CheckpointError


def full_model_state(store: CheckpointStore, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights, unsharded, on the CPU (hash-verified on the way)."""
    if manifest.kind == "state":
        return store.load(manifest)["user"]["model"]
    kind = manifest.attributes.get("format")
    staging = Path(tempfile.mkdtemp(prefix="tp-consolidate-"))
    try:
        store.restore_files(manifest, staging / "checkpoint")
        if kind == "torch.distributed.checkpoint":
            from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

            dcp_to_torch_save(staging / "checkpoint", staging / "full.pt")
            return torch.load(staging / "full.pt", weights_only=False)["model"]
        if kind == "deepspeed":
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            from training_platform.train.strategies.deepspeed import TAG

            state = get_fp32_state_dict_from_zero_checkpoint(str(staging / "checkpoint"), tag=TAG)
            return {name: tensor.clone() for name, tensor in state.items()}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    raise CheckpointError(f"checkpoint {manifest.uri} has format {kind!r}, which no strategy here can read")
