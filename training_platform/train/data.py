"""The loop's data: batches by step (resumable), the loss, and a validation pass, per task.

Classification (digits) keeps its small split in memory and indexes it with StepSampler, as
the foundation did, so its runs stay bitwise reproducible. Language modelling streams the
snapshot's shards (``datasets.stream``) through the node-local cache with worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from training_platform.datasets import SnapshotManifest, read_split
from training_platform.datasets.stream import StepBatches, StreamPlan, batch_loader
from training_platform.train.sampler import StepSampler
from training_platform.train.session import TrainingSession

Batch = tuple[torch.Tensor, torch.Tensor]
VAL_BATCHES = 8
MAX_PREFETCH_WORKERS = 2


def prefetch_workers(procs_per_node: int, cores: int | None = None) -> int:
    """DataLoader processes per rank: up to two where the node has cores to spare, none where every
    core already runs a rank (there they take CPU from the ranks they feed: 8% slower GPT steps
    with 2 ranks on 2 cores, at the same data wait)."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(0, min(MAX_PREFETCH_WORKERS, cores // procs_per_node - 1))


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


@torch.no_grad()
def evaluate(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    model.eval()
    logits = model(features)
    model.train()
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": (logits.argmax(dim=1) == labels).float().mean().item(),
    }


def build_data(session: TrainingSession, manifest: SnapshotManifest, template: ModuleType) -> TrainData:
    task = getattr(template, "TASK", "classification")
    if task == "causal_lm":
        return _language_model_data(session, manifest, template)
    return _classification_data(session)


def _classification_data(session: TrainingSession) -> TrainData:
    spec, device, info = session.spec, session.dist.device, session.dist
    root, snapshot_id = session.snapshot_root, spec.dataset.snapshot_id
    x_train, y_train = (torch.from_numpy(a) for a in read_split(root, snapshot_id, "train"))
    x_val, y_val = (torch.from_numpy(a).to(device) for a in read_split(root, snapshot_id, "validation"))
    sampler = StepSampler(len(x_train), spec.training.batch_size, info.rank, info.world_size, spec.training.seed)

    def batches(start: int) -> Iterator[Batch]:
        step = start
        while True:
            index = sampler.indices(step)
            yield x_train[index].to(device), y_train[index].to(device)
            step += 1

    return TrainData(
        batches=batches,
        loss=F.cross_entropy,
        evaluate=lambda model: evaluate(model, x_val, y_val),
        epoch=lambda step: sampler.position(step)[0],
    )


def _language_model_data(session: TrainingSession, manifest: SnapshotManifest, template: ModuleType) -> TrainData:
    spec, device, info = session.spec, session.dist.device, session.dist
    cfg = spec.training
    columns = manifest.feature_columns[: spec.model.seq_len + 1]

    def stream(split: str, rank: int, world_size: int) -> StepBatches:
        rows = tuple(ref.rows for ref in manifest.splits[split])
        plan = StreamPlan(rows, cfg.batch_size, rank, world_size, cfg.seed)
        return StepBatches(session.snapshot_root, manifest, split, plan, columns=columns)

    train_stream = stream("train", info.rank, info.world_size)
    # Validation: the same fixed batches on every rank, so the metric does not depend on world size.
    val_stream = stream("validation", 0, 1)
    val_rows = [val_stream[step] for step in range(min(VAL_BATCHES, val_stream.plan.steps_in_epoch(0)))]

    workers = prefetch_workers(spec.resources.procs_per_node)

    def batches(start: int) -> Iterator[Batch]:
        if not workers:  # the loop reads in this process: decode now, before the first step, not between steps
            train_stream.preload(start)
        return (
            tuple(t.to(device, non_blocking=True) for t in template.split_batch(rows, spec))
            for rows in batch_loader(train_stream, start, cfg.max_steps, workers=workers)
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
        epoch=lambda step: train_stream.plan.position(step)[0],
        tokens_per_sample=spec.model.seq_len,
    )
