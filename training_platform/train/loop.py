"""The training loop for every template and strategy, written against the worker SDK.

Read top to bottom: load data, build the model, wrap it with the spec's strategy, restore,
train (with telemetry), checkpoint, finish.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch
from torch import nn

from training_platform.datasets import load_manifest
from training_platform.hardware import peak_flops
from training_platform.spec import TrainingSpec
from training_platform.train.data import build_data
from training_platform.train.meter import StepMeter
from training_platform.train.session import TrainingSession
from training_platform.train.strategies import build_strategy
from training_platform.train.templates import get_template

__all__ = ["LOOP_SUMMARY", "build_optimizer", "train"]
LOOP_SUMMARY = "loop.json"


def build_optimizer(params: Iterable[nn.Parameter], cfg: TrainingSpec) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    optimizer_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return optimizer_cls(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


def train(session: TrainingSession) -> dict:
    spec, cfg = session.spec, session.spec.training
    manifest = load_manifest(session.hooks.snapshot_root, spec.dataset.snapshot_id)
    template = get_template(spec.model.template)
    data = build_data(session, manifest, template)

    model = template.build_model(spec, manifest.num_features, manifest.num_classes)
    flops = template.flops_per_sample(model, spec) if hasattr(template, "flops_per_sample") else None
    strategy = build_strategy(session)
    strategy.setup(model, lambda params: build_optimizer(params, cfg))
    step = strategy.restore() or 0

    meter = StepMeter(cfg.batch_size, data.tokens_per_sample, flops, peak_flops(session.dist.device))
    batches = data.batches(step)
    val_metrics: dict[str, float] = {}
    final_weights = None
    while step < cfg.max_steps:
        with meter.waiting_for_data(), session.hooks.data_wait():  # session: run telemetry, slow-data drills
            inputs, targets = next(batches)
        loss = data.loss(strategy.forward(inputs), targets)
        strategy.step(loss)
        strategy.poll()
        step += 1
        meter.step_done()

        metrics = {"train_loss": loss.item()} | meter.report() if step % cfg.log_every == 0 else {}
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            val_metrics = {f"val_{k}": v for k, v in data.evaluate(strategy.eval_module).items()}
            metrics.update(val_metrics)
        if metrics:
            session.report(step, metrics | {"epoch": float(data.epoch(step - 1))})
        saved = session.hooks.should_checkpoint(step)
        if saved:
            # The last checkpoint also holds the full weights, gathered here on the workers: what the
            # orchestrator evaluates and registers, without reading shards (or unpickling anything).
            final_weights = strategy.full_state_dict() if step == cfg.max_steps else None
            strategy.save(step, val_metrics, final_weights=final_weights)
        if step < cfg.max_steps and session.should_stop():
            if not saved:
                strategy.save(step, val_metrics)
            strategy.flush()
            session.hooks.exit_preempted(step)

    if session.dist.is_main:  # the loop's own figures, for benchmarks and `tp` (run telemetry has the rest)
        (session.run_dir / LOOP_SUMMARY).write_text(json.dumps(meter.summary()))
    strategy.flush()
    weights = final_weights if final_weights is not None else strategy.full_state_dict()
    return session.finish(weights, step, val_metrics)
