"""The training loop for classification templates, written against the worker SDK.

Read top to bottom: load data, build the model, restore, train, checkpoint, finish.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training_platform.datasets import load_manifest, read_split
from training_platform.train.sampler import StepSampler
from training_platform.train.session import TrainingSession
from training_platform.train.templates import get_template


def build_optimizer(model: nn.Module, session: TrainingSession) -> torch.optim.Optimizer:
    cfg = session.spec.training
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    optimizer_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return optimizer_cls(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


@torch.no_grad()
def evaluate(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    model.eval()
    logits = model(features)
    model.train()
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": (logits.argmax(dim=1) == labels).float().mean().item(),
    }


def train(session: TrainingSession) -> dict:
    spec, cfg, device = session.spec, session.spec.training, session.dist.device
    snapshot_id = spec.dataset.snapshot_id
    manifest = load_manifest(session.snapshot_root, snapshot_id)
    x_train, y_train = (torch.from_numpy(a) for a in read_split(session.snapshot_root, snapshot_id, "train"))
    x_val, y_val = (
        torch.from_numpy(a).to(device) for a in read_split(session.snapshot_root, snapshot_id, "validation")
    )

    model = get_template(spec.model.template).build_model(spec, manifest.num_features, manifest.num_classes)
    model.to(device)
    optimizer = build_optimizer(model, session)
    sampler = StepSampler(len(x_train), cfg.batch_size, session.dist.rank, session.dist.world_size, cfg.seed)

    step = 0
    restored = session.restore()
    if restored is not None:
        state, step = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    ddp = DistributedDataParallel(model) if session.dist.world_size > 1 else model

    def checkpoint_state() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    val_metrics: dict[str, float] = {}
    while step < cfg.max_steps:
        batch = sampler.indices(step)
        inputs, targets = x_train[batch].to(device), y_train[batch].to(device)
        loss = F.cross_entropy(ddp(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1

        metrics = {"train_loss": loss.item()} if step % cfg.log_every == 0 else {}
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            val_metrics = {f"val_{k}": v for k, v in evaluate(model, x_val, y_val).items()}
            metrics.update(val_metrics)
        if metrics:
            session.report(step, metrics | {"epoch": float(sampler.position(step - 1)[0])})
        saved = session.should_checkpoint(step)
        if saved:
            session.save(checkpoint_state(), step, val_metrics)
        if step < cfg.max_steps and session.should_stop():
            if not saved:
                session.save(checkpoint_state(), step, val_metrics)
            session.exit_preempted(step)

    return session.finish(model.state_dict(), step, val_metrics)
