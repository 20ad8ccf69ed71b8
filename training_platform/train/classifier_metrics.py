"""A classifier's metrics on held-out rows: what the built-in templates' validation and the platform's evaluation
report (`loss`, `accuracy`). Torch alone: the worker's loop, its evaluation mode and the registry's evaluation
import it without the session."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def classifier_metrics(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Cross-entropy loss and accuracy of MODEL's logits on FEATURES against LABELS (the model is left training)."""
    model.eval()
    logits = model(features)
    model.train()
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": (logits.argmax(dim=1) == labels).float().mean().item(),
    }
