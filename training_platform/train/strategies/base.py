"""What every strategy offers the loop: wrap, step, save, restore, gather the full weights."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from training_platform.checkpoints import CheckpointManifest
from training_platform.errors import CheckpointError
from training_platform.train import distributed
from training_platform.train.session import TrainingSession
from training_platform.train.strategies.background_save import BackgroundSaves

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
Weights = dict[str, torch.Tensor]


def with_buffers_copied(module: nn.Module, model_state: dict[str, Any]) -> dict[str, Any]:
    """The model's state with its buffers (a norm's running statistics, which forward changes) copied now, for a
    save whose copy of the rest runs beside the next forward and backward (they change parameters only in the
    optimizer step)."""
    buffers = {name for name, _ in module.named_buffers()}
    return {name: value.clone() if name in buffers else value for name, value in model_state.items()}


class Strategy(ABC):
    """One way to spread a model over the process group.

    Use: ``setup(model, make_optimizer)``; then per step ``loss = forward(x)...; step(loss)``;
    ``save(step, metrics)`` / ``restore()`` go through the session's checkpoint store.
    """

    name: str = ""

    def __init__(self, session: TrainingSession):
        self.session = session
        self.module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        # Where periodic saves are written in the background (checkpoint.async_save), by the strategies that can.
        self.background: BackgroundSaves | None = None

    @abstractmethod
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        """Move, wrap and shard the model; build the optimizer over the parameters this rank owns."""

    @abstractmethod
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The training forward pass (through the wrapper, so gradients are synchronized)."""

    @abstractmethod
    def step(self, loss: torch.Tensor) -> None:
        """Backward, optimizer step, gradients cleared."""

    @abstractmethod
    def save(self, step: int, metrics: dict[str, float], *, final_weights: Weights | None = None) -> None:
        """Collective: checkpoint model, optimizer, every rank's RNG and the step.

        `final_weights` (the run's last save: `full_state_dict()`, complete on rank 0) go into the
        same checkpoint as plain tensors, which evaluation reads without the strategy's own format.
        """

    def in_background(self, final_weights: Weights | None) -> bool:
        """Whether a save goes to the background (checkpoint.async_save): every periodic one, not the last, which
        carries the weights gathered on rank 0 and is the run's result, written before the run ends."""
        return self.session.spec.checkpoint.async_save and final_weights is None

    def poll(self) -> None:
        """Once a step: the bookkeeping of a save that ended in the background."""
        self._collect(wait=False)

    def flush(self) -> None:
        """Wait until the save in flight is durable (or reported failed): before the next, the end, a preemption."""
        self._collect(wait=True)

    def _collect(self, wait: bool) -> None:
        finished = self.background.finished(wait) if self.background is not None else None
        if finished is None:
            return
        if isinstance(finished.error, CheckpointError | OSError):  # training goes on; the next save tries again
            self.session.hooks.checkpoint_failed(finished.step, str(finished.error))
        elif finished.error is not None:
            raise finished.error
        else:
            self.record_saved(finished.manifest, finished.stall_seconds)

    @abstractmethod
    def restore(self) -> int | None:
        """Collective: load the newest checkpoint this strategy wrote; the step, or None."""

    @abstractmethod
    def full_state_dict(self) -> Weights:
        """Collective: the full, unsharded model weights (complete on rank 0)."""

    @property
    def eval_module(self) -> nn.Module:
        """The module for evaluation forwards (every rank must call it when weights are sharded)."""
        assert self.module is not None, "call setup() first"
        return self.module

    # ----- shared bookkeeping -------------------------------------------------------------------
    def gathered_rng(self) -> list[dict[str, Any]]:
        return distributed.all_gather_rng_states(self.session.dist)

    def set_rng(self, rng_states: list[dict[str, Any]]) -> None:
        distributed.set_rng_state(rng_states[self.session.dist.rank % len(rng_states)])

    def record_saved(self, manifest: CheckpointManifest, seconds: float) -> None:
        self.session.hooks.checkpoint_saved(manifest, seconds)

    def record_restored(self, manifest: CheckpointManifest, step: int) -> None:
        self.session.hooks.checkpoint_restored(manifest, step)
