"""The loop's data: batches by step (resumable), the loss, and a validation pass, per task.

Both read the snapshot through the worker SDK's datasets (`session.dataset`, as a user's script does).
Classification (digits) keeps its small split in memory and indexes it with StepSampler, as the
foundation did, so its runs stay bitwise reproducible. Language modelling streams the snapshot's
shards through the node-local cache with worker processes (`stream=True`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from training_platform.datasets import SnapshotManifest
from training_platform.train.classifier_metrics import classifier_metrics
from training_platform.train.session import TrainingSession
from training_platform.train.split_data import SplitStream

Batch = tuple[torch.Tensor, torch.Tensor]
VAL_BATCHES = 8


@dataclass
class TrainData:
    batches: Callable[[int], Iterator[Batch]]
    """Batches for steps start, start+1, ... (on the device)."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module], dict[str, float]]
    """Validation metrics; every rank calls it (sharded models gather weights collectively)."""
    epoch: Callable[[int], int]
    """Epoch of 0-based step."""
    tokens_per_sample: int = 0


def build_data(session: TrainingSession, manifest: SnapshotManifest, template: ModuleType) -> TrainData:
    if manifest.role_columns:
        raise ValueError(
            f"model template {session.spec.model.template!r} reads numeric features, and snapshot "
            f"{manifest.snapshot_id[:12]} holds {' and '.join(manifest.role_columns)}: train it with your own script "
            "(entrypoint.script), which reads them as batch.text / batch.image"
        )
    task = getattr(template, "TASK", "classification")
    if task == "causal_lm":
        return _language_model_data(session, manifest, template)
    return _classification_data(session)


def _classification_data(session: TrainingSession) -> TrainData:
    device = session.dist.device
    train = session.dataset("train")
    validation = session.dataset("validation")
    x_val, y_val = validation.features.to(device), validation.labels.to(device)

    def batches(start: int) -> Iterator[Batch]:
        return ((x.to(device), y.to(device)) for x, y in train.from_step(start))

    return TrainData(
        batches=batches,
        loss=F.cross_entropy,
        evaluate=lambda model: classifier_metrics(model, x_val, y_val),
        epoch=train.epoch,
    )


def _language_model_data(session: TrainingSession, manifest: SnapshotManifest, template: ModuleType) -> TrainData:
    spec, device = session.spec, session.dist.device
    cfg = spec.training
    columns = manifest.feature_columns[: spec.model.seq_len + 1]
    train = session.dataset("train", stream=True, columns=columns)
    # Validation: the same fixed batches on every rank (as one rank of one), so the metric does not depend on
    # world size.
    sampling = {"batch_size": cfg.batch_size, "rank": 0, "world_size": 1, "seed": cfg.seed}
    root, snapshot_id = session.hooks.snapshot_root, manifest.snapshot_id
    validation = SplitStream.load(root, snapshot_id, "validation", columns=columns, **sampling)
    val_steps = min(VAL_BATCHES, validation.batches.plan.steps_in_epoch(0))
    val_rows = [validation[step][0] for step in range(val_steps)]

    def batches(start: int) -> Iterator[Batch]:
        return (
            tuple(t.to(device, non_blocking=True) for t in template.split_batch(tokens, spec))
            for tokens, _ in train.from_step(start, cfg.max_steps)
        )

    @torch.no_grad()
    def evaluate_lm(model: nn.Module) -> dict[str, float]:
        model.eval()
        losses = []
        for rows in val_rows:
            inputs, targets = template.split_batch(rows, spec)
            losses.append(template.loss_fn(model(inputs.to(device)), targets.to(device)).item())
        model.train()
        loss = sum(losses) / len(losses)
        return {"loss": loss, "perplexity": float(torch.tensor(loss).exp())}

    return TrainData(
        batches=batches,
        loss=template.loss_fn,
        evaluate=evaluate_lm,
        epoch=train.epoch,
        tokens_per_sample=spec.model.seq_len,
    )
