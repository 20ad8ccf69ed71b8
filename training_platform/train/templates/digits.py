"""A small MLP classifier for the 8x8 digits images."""

from __future__ import annotations

from torch import nn

from training_platform.spec import TrainSpec

HIDDEN = {"tiny": 32, "small": 64, "base": 128}


def build_model(spec: TrainSpec, num_features: int, num_classes: int) -> nn.Module:
    hidden = HIDDEN[spec.model.size]
    return nn.Sequential(
        nn.Linear(num_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def flops_per_sample(model: nn.Module, spec: TrainSpec) -> float:
    """Training FLOPs per image: forward 2 per weight, backward 4."""
    return 6.0 * sum(p.numel() for p in model.parameters())
