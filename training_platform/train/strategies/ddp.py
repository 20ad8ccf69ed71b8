"""DDP: every rank holds the whole model; gradients are all-reduced in buckets during backward.

Checkpoints are replicated state (rank 0 writes model + optimizer; every rank's RNG goes along),
the format the evaluation and registry assets read.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training_platform.train.strategies.base import OptimizerFactory, Strategy, Weights, with_buffers_copied


class DDPStrategy(Strategy):
    name = "ddp"

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        self.module = model.to(self.session.dist.device)
        self.optimizer = make_optimizer(self.module.parameters())
        # One process needs no wrapper; DDP's construction broadcast would be a no-op anyway.
        self._wrapped = DistributedDataParallel(self.module) if self.session.dist.world_size > 1 else self.module
        if self.session.dist.is_main:  # saves go through the session's checkpointer: its writer starts now
            self.session.hooks.start_writer()
        self.session.hooks.overlap_saves()  # step() lets a save's copy finish before the optimizer changes the state

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._wrapped(*inputs)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.session.hooks.before_update()
        self.optimizer.step()

    def save(self, step: int, metrics: dict[str, float], *, final_weights: Weights | None = None) -> None:
        # The state holds the full model already: `final_weights` adds nothing here.
        model = with_buffers_copied(self.module, self.module.state_dict())
        state = {"model": model, "optimizer": self.optimizer.state_dict()}
        self.session.save(state, step, metrics)

    def restore(self) -> int | None:
        # Read into the module's own parameters and buffers (the optimizer's state exists only after its first
        # step): load_state_dict then finds each of them in place already.
        restored = self.session.restore(into={"model": self.module.state_dict()})
        if restored is None:
            return None
        state, step = restored
        # In place: DDP's buckets keep pointing at the same parameter tensors.
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return step

    def full_state_dict(self) -> Weights:
        return self.module.state_dict()
