"""The accelerators the platform knows: memory and peak dense bf16 throughput (no prices: see cost/).

Figures are the vendors' datasheet numbers for dense (not 2:4 sparse) math; T4 has no bf16,
so its fp16 tensor-core peak stands in. Keys match ``spec.GPU_TYPES``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    """Device memory as sold (GB on the datasheet, treated as GiB of usable capacity before overhead)."""
    bf16_tflops: float
    """Peak dense bf16 tensor-core TFLOP/s."""
    device_names: tuple[str, ...]
    """Substrings of ``torch.cuda.get_device_name()`` that identify this GPU."""


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("T4", 16, 65, ("T4",)),
        GPU("A10G", 24, 70, ("A10G",)),
        GPU("L4", 24, 121, ("L4",)),
        GPU("L40S", 48, 362, ("L40S",)),
        GPU("A100-40GB", 40, 312, ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB")),
        GPU("A100-80GB", 80, 312, ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80GB")),
        GPU("H100", 80, 989, ("H100",)),
        GPU("H200", 141, 989, ("H200",)),
    )
}


def gpu_for_device_name(device_name: str) -> GPU | None:
    """The table entry for a CUDA device name (e.g. 'NVIDIA A100-SXM4-80GB'), or None when unknown."""
    # Longest marker first, so 'L40S' is not taken for 'L4'.
    candidates = sorted(((m, g) for g in GPUS.values() for m in g.device_names), key=lambda x: -len(x[0]))
    for marker, gpu in candidates:
        if marker in device_name:
            return gpu
    return None


def peak_flops(device) -> float | None:
    """Peak bf16 FLOP/s of a torch device, when it is a GPU in the table; None on CPU or unknown GPUs."""
    import torch

    if getattr(device, "type", "cpu") != "cuda" or not torch.cuda.is_available():
        return None
    gpu = gpu_for_device_name(torch.cuda.get_device_name(device))
    return gpu.bf16_tflops * 1e12 if gpu else None
