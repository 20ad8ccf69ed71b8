"""What a model logged to MLflow needs to load: the worker's evaluation logs it, the registry registers it."""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version


def model_requirements(*extra: str) -> list[str]:
    """What a registered model needs to load, pinned (EXTRA: a flavour's own packages). Named rather than
    inferred: MLflow infers them by loading the model in a subprocess (5 s of every registration here) and
    lists whatever this process had imported (transformers, lightning, trio)."""
    # Public versions: a local label (torch's "+cpu", "+cu128") is not on PyPI, so pip could not install it.
    return [f"{name}=={Version(version(name)).public}" for name in ("mlflow", "torch", "numpy", "cloudpickle", *extra)]
