"""Right-sizing: memory per GPU for a spec, and the GPU type and count that fit it best.

The arithmetic is the standard one (ZeRO paper, Rajbhandari et al. 2020; activations from
Korthikanti et al. 2022), for mixed-precision training on GPUs:

- weights 2 bytes/param (bf16), gradients 2, optimizer states 12 for Adam/AdamW (fp32 master
  weights, momentum, variance) or 4 for SGD (fp32 master weights): 16 bytes/param with Adam;
- ZeRO-1 divides the optimizer states by the data-parallel size N, ZeRO-2 also the gradients,
  ZeRO-3 and FSDP (full shard) all three; DDP divides nothing;
- CPU offload moves the optimizer states (offload_optimizer) or the weights (offload_params) off the GPU;
- transformer activations per layer: s*b*h*(34 + 5*a*s/h) bytes (16-bit, no recomputation), plus
  4*s*b*V bytes of fp32 logits; other models: 2 bytes per output element of each layer, twice.

A GPU fits when the total is at most USABLE_FRACTION of its memory (the rest goes to the CUDA
context, allocator fragmentation and communication buffers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from training_platform.hardware import GPU, GPUS
from training_platform.spec import TrainSpec

GIB = 1024**3
USABLE_FRACTION = 0.9
ASSUMED_MFU = 0.4
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WEIGHT_BYTES, GRAD_BYTES = 2, 2
OPTIMIZER_BYTES = {"adam": 12, "adamw": 12, "sgd": 4}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model."""

    params: int
    flops_per_sample: float
    layers: int = 0
    width: int = 0
    heads: int = 0
    seq_len: int = 0
    vocab: int = 0
    activation_elements_per_sample: int = 0
    """For non-transformer models: output elements of every layer for one sample."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    cpu_offloaded: float
    """Bytes per rank kept in host memory instead (offload)."""

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations

    def as_dict(self) -> dict[str, float]:
        return asdict(self) | {"model_states": self.model_states, "total": self.total}


def sharding(strategy: str, zero_stage: int) -> tuple[bool, bool, bool]:
    """Which of (weights, gradients, optimizer states) are divided by the data-parallel size."""
    if strategy == "fsdp":
        return True, True, True
    if strategy == "deepspeed":
        return zero_stage >= 3, zero_stage >= 2, zero_stage >= 1
    return False, False, False


def model_state_bytes(
    params: int,
    dp: int,
    *,
    strategy: str = "ddp",
    zero_stage: int = 0,
    optimizer: str = "adam",
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer states, offloaded) bytes per GPU."""
    shard_w, shard_g, shard_o = sharding(strategy, zero_stage)
    weights = params * WEIGHT_BYTES / (dp if shard_w else 1)
    grads = params * GRAD_BYTES / (dp if shard_g else 1)
    optim = params * OPTIMIZER_BYTES[optimizer] / (dp if shard_o else 1)
    offloaded = 0.0
    if offload_optimizer:
        offloaded, optim = offloaded + optim, 0.0
    if offload_params:
        offloaded, weights = offloaded + weights, 0.0
    return weights, grads, optim, offloaded


def transformer_activation_bytes(seq_len: int, batch: int, width: int, heads: int, layers: int, vocab: int) -> float:
    """Korthikanti et al. eq. (2) summed over layers, plus fp32 logits for the loss."""
    per_layer = seq_len * batch * width * (34 + 5 * heads * seq_len / width)
    return layers * per_layer + 4 * seq_len * batch * vocab


def estimate(shape: ModelShape, spec: TrainSpec, dp: int) -> MemoryEstimate:
    options = spec.deepspeed
    weights, grads, optim, offloaded = model_state_bytes(
        shape.params,
        dp,
        strategy=spec.strategy,
        zero_stage=options.zero_stage if spec.strategy == "deepspeed" else 0,
        optimizer=spec.training.optimizer,
        offload_optimizer=spec.strategy == "deepspeed" and options.offload_optimizer,
        offload_params=spec.strategy == "deepspeed" and options.offload_params,
    )
    batch = spec.training.batch_size
    if shape.layers:
        activations = transformer_activation_bytes(
            shape.seq_len, batch, shape.width, shape.heads, shape.layers, shape.vocab
        )
    else:
        activations = 2.0 * 2 * batch * shape.activation_elements_per_sample
    return MemoryEstimate(weights, grads, optim, activations, offloaded)


def fits(memory: MemoryEstimate, gpu: GPU) -> bool:
    return memory.total <= USABLE_FRACTION * gpu.memory_gib * GIB


def step_hours(shape: ModelShape, spec: TrainSpec, gpu: GPU) -> float:
    """Hours for all steps at ASSUMED_MFU of the GPU's bf16 peak (each rank does its own batch)."""
    seconds = shape.flops_per_sample * spec.training.batch_size / (gpu.bf16_tflops * 1e12 * ASSUMED_MFU)
    return seconds * spec.training.max_steps / 3600


def _price(gpu: str, spot: bool) -> float | None:
    try:
        from training_platform.cost.prices import load_price_model

        return load_price_model().base_price(gpu, spot)
    except Exception:  # noqa: BLE001 - prices are optional: without them, rank by memory bought
        return None


def recommend(shape: ModelShape, spec: TrainSpec) -> list[dict[str, Any]]:
    """For each GPU type, the smallest count that fits, with its estimated hours and cost; best first."""
    options = []
    for gpu in GPUS.values():
        for count in COUNTS:
            memory = estimate(shape, spec, count)
            if fits(memory, gpu):
                hours = step_hours(shape, spec, gpu)
                price = _price(gpu.name, spec.resources.spot)
                options.append(
                    {
                        "gpu_type": gpu.name,
                        "count": count,
                        "per_gpu_gib": round(memory.total / GIB, 3),
                        "memory_gib": gpu.memory_gib,
                        "hours": hours,
                        "usd_per_gpu_hour": price,
                        "usd": None if price is None else count * price * hours,
                    }
                )
                break
            if not any(sharding(spec.strategy, spec.deepspeed.zero_stage)):
                break  # nothing is sharded: more GPUs never lower the memory per GPU
    return sorted(options, key=lambda o: (o["usd"] is None, o["usd"] or 0.0, o["count"] * o["memory_gib"]))


def plan_spec(spec: TrainSpec, shape: ModelShape) -> dict[str, Any]:
    """The estimate for the spec as written (its world size) and the recommended GPU type and count."""
    dp = spec.resources.world_size
    memory = estimate(shape, spec, dp)
    options = recommend(shape, spec)
    requested = GPUS.get(spec.resources.gpu_type or "")
    return {
        "params": shape.params,
        "strategy": spec.strategy if spec.strategy != "deepspeed" else f"deepspeed-zero{spec.deepspeed.zero_stage}",
        "data_parallel_size": dp,
        "per_gpu_bytes": memory.as_dict(),
        "per_gpu_gib": round(memory.total / GIB, 3),
        "requested_gpu": spec.resources.gpu_type,
        "requested_fits": None if requested is None else fits(memory, requested),
        "recommendation": options[0] if options else None,
        "options": options,
    }


def model_shape(spec: TrainSpec, num_features: int | None = None, num_classes: int | None = None) -> ModelShape:
    """Build the spec's template on the meta device (no memory) and read off its shape."""
    import torch

    from training_platform.train.templates import get_template

    template = get_template(spec.model.template)
    causal = getattr(template, "TASK", "classification") == "causal_lm"
    num_features = num_features or (spec.model.seq_len + 1 if causal else 64)
    num_classes = num_classes or (256 if causal else 10)
    with torch.device("meta"):
        model = template.build_model(spec, num_features, num_classes)
    params = sum(p.numel() for p in model.parameters())
    flops = template.flops_per_sample(model, spec) if hasattr(template, "flops_per_sample") else 6.0 * params
    if causal:
        layers, heads, width = template.dimensions(spec)
        return ModelShape(params, flops, layers, width, heads, spec.model.seq_len, num_classes)
    outputs = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    return ModelShape(params, flops, activation_elements_per_sample=outputs)
