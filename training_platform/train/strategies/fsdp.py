"""FSDP2: ``fully_shard`` on each layer, then on the root; weights, gradients and optimizer
states are sharded across ranks and gathered layer by layer for each forward and backward.

Checkpoints are sharded: each rank writes its own shard through torch.distributed.checkpoint
into the checkpoint store (``checkpoints.sharded``), so no rank ever holds the whole model. With
``checkpoint.async_save`` (the default) a periodic save is written in the background
(``background_save``): each rank's shard is copied while the next forward and backward run, and
the loop waits for the copy only before its optimizer step changes the state.
"""

from __future__ import annotations

import functools
import time

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from training_platform.checkpoints import CheckpointManifest
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.sharded import DCP_FORMAT, list_on_main, restore_latest_sharded, save_sharded
from training_platform.train.rng_json import rng_states_from_json, rng_states_to_json
from training_platform.train.strategies.background_save import BackgroundSaves, ShardStaging
from training_platform.train.strategies.base import OptimizerFactory, Strategy, Weights, with_buffers_copied

FORMAT = DCP_FORMAT


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The units to shard one by one: a template's ``blocks`` if it has them, else its children with weights."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    return [child for child in model.children() if any(True for _ in child.parameters())]


class FSDPStrategy(Strategy):
    name = "fsdp"
    _staging: ShardStaging | None = None

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        info = self.session.dist
        model = model.to(info.device)
        if info.world_size > 1:
            mesh = init_device_mesh(info.device.type, (info.world_size,))
            # Per layer first, so each layer's weights are gathered only while that layer runs.
            for layer in layers_of(model):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        self.module = model
        self.optimizer = make_optimizer(model.parameters())
        if self.session.spec.checkpoint.async_save:
            self.background, self._staging = BackgroundSaves(), ShardStaging()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module(*inputs)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self._staging is not None:
            self._staging.ready()  # a save's copy of the state is complete before the state changes
        self.optimizer.step()

    def _state(self) -> dict:
        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def save(self, step: int, metrics: dict[str, float], *, final_weights: Weights | None = None) -> None:
        started = time.monotonic()
        self.flush()  # one save in flight: the one before first
        # RNG states as one JSON item: DCP would otherwise flatten the lists inside them into keys.
        state = self._state() | {"rng": rng_states_to_json(self.gathered_rng()).encode(), "step": step}
        save = functools.partial(save_sharded, self.session.hooks.store, self.session.run_id, step, metrics=metrics)
        if not self.in_background(final_weights):
            weights = final_weights if self.session.dist.is_main else None  # complete on rank 0 only
            self.record_saved(save(state, weights=weights), time.monotonic() - started)
            return
        copy = self._staging.copy(state | {"model": with_buffers_copied(self.module, state["model"])})
        stall = time.monotonic() - started

        def save_copy(pacer: Pacer) -> CheckpointManifest:
            staged, waited = self._staging.copied(copy)  # the loop's stall: this call and its wait in step()
            return save(staged, process_group=self._staging.group, stall_seconds=stall + waited, pacer=pacer)

        self.background.submit(step, save_copy, stall)

    def restore(self) -> int | None:
        session = self.session
        checkpoints = list_on_main(session.hooks.store, session.run_id)
        if not checkpoints.manifests and not checkpoints.unreadable:
            return None  # skip get_state_dict's optimizer-state initialization on a fresh run
        state = self._state() | {"rng": b"", "step": -1}
        # Raises on every rank when the run has checkpoints and none restores: it must not start over.
        restored = restore_latest_sharded(session.hooks.store, session.run_id, state, checkpoints=checkpoints)
        assert restored is not None, "the run has checkpoints, so restore_latest_sharded restores one or raises"
        manifest, skipped = restored
        for step, reason in skipped:
            session.hooks.reporter.info(f"skipped checkpoint step {step}: {reason}")
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.set_rng(rng_states_from_json(state["rng"]))
        self.record_restored(manifest, int(state["step"]))
        return int(state["step"])

    def full_state_dict(self) -> Weights:
        if self.session.dist.world_size == 1:
            return self.module.state_dict()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.module, options=options)
