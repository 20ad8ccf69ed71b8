"""Model templates, registered by name. Adding a template is one module plus one line here.

A template module provides ``build_model(spec, num_features, num_classes) -> nn.Module`` and may set
``TASK`` ("classification", the default, or "causal_lm") and ``flops_per_sample(model, spec)``; the
registry maps names to modules lazily so that validating a spec never imports torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# By the names the spec accepts (spec.MODEL_TEMPLATES).
TEMPLATES: dict[str, str] = {
    "digits_mlp": "training_platform.train.templates.digits",
    "gpt": "training_platform.train.templates.gpt",
}


def get_template(name: str) -> ModuleType:
    if name not in TEMPLATES:
        raise KeyError(f"unknown model template {name!r}; use one of: {', '.join(TEMPLATES)}")
    return importlib.import_module(TEMPLATES[name])
