"""DeepSpeed ZeRO stages 1-3, optionally with optimizer/parameter offload to the CPU.

ZeRO-1 shards optimizer states, ZeRO-2 also gradients, ZeRO-3 also the weights. On a machine
without GPUs DeepSpeed picks its CPU accelerator by itself and talks over the gloo group the
session opened.

Checkpoints: DeepSpeed's own ``save_checkpoint`` writes every rank's files into a staging
directory under the run directory (shared by all ranks, as DeepSpeed itself assumes), then
rank 0 publishes them through the checkpoint store as one files checkpoint (chunks first,
manifest last): with ``checkpoint.async_save`` (the default), a periodic save's in the background
(``background_save``), so the loop waits only for DeepSpeed's writes to the staging directory.
Restore fetches and verifies the files, then ``load_checkpoint`` reads them.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training_platform.checkpoints import CheckpointManifest
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.sharded import list_on_main, written_as
from training_platform.checkpoints.store import nothing_restores
from training_platform.errors import CheckpointError, SpecError
from training_platform.spec import TrainSpec
from training_platform.train.rng_json import rng_states_from_json, rng_states_to_json
from training_platform.train.strategies.background_save import BackgroundSaves
from training_platform.train.strategies.base import OptimizerFactory, Strategy, Weights

FORMAT = "deepspeed"
TAG = "checkpoint"


def deepspeed_config(spec: TrainSpec, num_params: int | None = None) -> dict[str, Any]:
    """The DeepSpeed config for a spec: ZeRO stage and offload from ``spec.deepspeed``, fp32."""
    options = spec.deepspeed
    zero: dict[str, Any] = {"stage": options.zero_stage}
    if num_params:
        # DeepSpeed's default buckets hold 5e8 elements (2 GB in fp32) whatever the model's size; an
        # eighth of the model per bucket still amortizes each collective and keeps ZeRO's savings.
        bucket = int(min(5e8, max(5e5, num_params // 8)))
        zero |= {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
        if options.zero_stage == 3:
            zero["stage3_prefetch_bucket_size"] = bucket
    if options.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if options.offload_params:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": spec.training.batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        # The loop builds a torch optimizer (same update rule as DDP/FSDP, so runs compare);
        # DeepSpeed's own fused optimizers would need compiled ops.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
    }


INSTALL_HINT = "pip install 'training-platform[deepspeed]' (the training image: --build-arg EXTRAS=deepspeed)"


def import_deepspeed() -> Any:
    """DeepSpeed, an optional extra; a SpecError saying how to install it when it is missing."""
    try:
        import deepspeed
    except ImportError:
        raise SpecError(f"strategy: deepspeed is not installed in this environment; {INSTALL_HINT}") from None
    return deepspeed


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        deepspeed = import_deepspeed()

        from training_platform.train.strategies.deepspeed_files import SafeCheckpointEngine

        _ensure_process_group(self.session.dist.backend)
        # On a CPU host, DeepSpeed's communication backend builds a shared-memory op, which only its inference
        # all-reduce uses: a C++ compile (~55 s of CPU, needing a compiler) at the first run in each environment,
        # a build check in every rank after that. Training reduces through torch.distributed.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=self.session.dist.backend)
        self.stage = self.session.spec.deepspeed.zero_stage
        optimizer = make_optimizer(model.parameters())
        config = deepspeed_config(self.session.spec, sum(p.numel() for p in model.parameters()))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model.to(self.session.dist.device), optimizer=optimizer, config=config
        )
        # Restores read the store's files: with weights_only, not DeepSpeed's full unpickling.
        self.engine.checkpoint_engine = SafeCheckpointEngine(config_params=self.engine._config)
        self.module = self.engine.module
        if self.session.spec.checkpoint.async_save and self.session.dist.is_main:  # rank 0 alone stores the files
            self.background = BackgroundSaves()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.engine(*inputs)

    def step(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.engine.step()  # also clears the gradients

    # ----- checkpoints ----------------------------------------------------------------------------
    def save(self, step: int, metrics: dict[str, float], *, final_weights: Weights | None = None) -> None:
        session, started = self.session, time.monotonic()
        self.flush()  # one save in flight: the one before first
        staging = session.run_dir / "deepspeed-staging" / f"step-{step}"
        # DeepSpeed writes client_state once (model-states file of rank 0), so gather all ranks' RNG.
        client_state = {"rng": rng_states_to_json(self.gathered_rng()), "step": step}
        self.engine.save_checkpoint(str(staging), tag=TAG, client_state=client_state)
        _barrier()  # every rank's files are in the staging directory
        in_background = self.in_background(final_weights)
        if not session.dist.is_main:
            if not in_background:
                _barrier()  # no rank goes on before the checkpoint is visible
            return
        attributes = {"format": FORMAT, "zero_stage": self.stage, "world_size": session.dist.world_size}

        def store_files(stall_seconds: float = 0.0, pacer: Pacer | None = None) -> CheckpointManifest:
            try:
                files = {str(p.relative_to(staging)): p for p in sorted(staging.rglob("*")) if p.is_file()}
                manifest, _ = session.hooks.store.save_files(
                    session.run_id, step, files, metrics, attributes,
                    weights=final_weights, stall_seconds=stall_seconds, pacer=pacer,
                )
                return manifest
            finally:
                shutil.rmtree(staging, ignore_errors=True)

        if in_background:
            stall = time.monotonic() - started
            self.background.submit(step, lambda pacer: store_files(stall, pacer), stall)
            return
        try:
            manifest = store_files()
        finally:
            _barrier()
        self.record_saved(manifest, time.monotonic() - started)

    def restore(self) -> int | None:
        session = self.session
        checkpoints = list_on_main(session.hooks.store, session.run_id)
        skipped = list(checkpoints.unreadable.items())
        for manifest in reversed(checkpoints.manifests):
            if manifest.attributes.get("format") != FORMAT:
                skipped.append((manifest.step, f"written by another strategy ({written_as(manifest)})"))
                continue
            staging = Path(tempfile.mkdtemp(prefix=f"tp-ds-restore-{session.dist.rank}-"))
            try:
                error = None
                try:
                    session.hooks.store.check_manifest(manifest)
                    session.hooks.store.restore_files(manifest, staging)
                except (CheckpointError, OSError) as exc:
                    error = str(exc)
                if error is None:
                    try:
                        path, client_state = self.engine.load_checkpoint(str(staging), tag=TAG)
                        if path is None:
                            raise CheckpointError(f"DeepSpeed found no checkpoint in {manifest.uri}'s files")
                        rng_states = rng_states_from_json(client_state["rng"])
                    except CheckpointError as exc:
                        error = f"checkpoint {manifest.uri}: {exc}"
                errors = [e for e in _all_gather(error) if e]
                if errors:  # every rank saw the same verdict, so all move on to the older one together
                    session.hooks.reporter.info(f"skipped checkpoint step {manifest.step}: {errors[0]}")
                    skipped.append((manifest.step, errors[0]))
                    continue
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self.set_rng(rng_states)
            self.record_restored(manifest, int(client_state["step"]))
            return int(client_state["step"])
        if skipped:  # the run has checkpoints and none restores: it must not start over
            raise nothing_restores(session.run_id, session.hooks.store.uri, sorted(skipped, reverse=True))
        return None

    def full_state_dict(self) -> Weights:
        if self.stage < 3:
            return self.module.state_dict()
        import deepspeed

        # ZeRO-3 keeps only this rank's slice of each weight: gather them all for the moment of the copy.
        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            return {name: tensor.detach().clone() for name, tensor in self.module.state_dict().items()}


def _ensure_process_group(backend: str) -> None:
    """DeepSpeed needs a process group even for one process; give it a private one."""
    if dist.is_initialized():
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(backend=backend, rank=0, world_size=1)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _all_gather(obj: Any) -> list[Any]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
