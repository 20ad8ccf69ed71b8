"""One process, no process group, nothing unpickled: the full model weights of any strategy's checkpoint.

Evaluation, registration and the `checkpoints` asset read checkpoints outside the training job, in
the orchestrator. They read tensors only: a DDP checkpoint's replicated model, or the full weights
that an FSDP or DeepSpeed run's workers gathered into its final checkpoint (loop.py). Merging the
shards here would mean parsing the framework's files, which DCP and DeepSpeed unpickle.
"""

from __future__ import annotations

import torch

from training_platform.checkpoints import CheckpointManifest, CheckpointStore
from training_platform.errors import CheckpointError


def full_model_state(store: CheckpointStore, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights, unsharded, on the CPU (hash-verified on the way)."""
    if manifest.kind == "files" and manifest.skeleton is None:
        raise CheckpointError(
            f"checkpoint {manifest.uri} ({manifest.attributes.get('format', 'files')}) holds no weights consolidated "
            "by its workers: a sharded run's workers store them with its final checkpoint only (older builds "
            "did not); evaluate that one, or re-run the training_run partition"
        )
    state = store.load(manifest)
    return state["user"]["model"] if manifest.kind == "state" else state["model"]
