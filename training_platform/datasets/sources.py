"""Raw data sources, registered by name: adding a source is one decorated function."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from training_platform.errors import SnapshotError

if TYPE_CHECKING:
    from training_platform.datasets.text import CharTokenizer


@dataclass(frozen=True, kw_only=True)
class RawSource:
    """A source's rows in its own order, before splitting."""

    name: str
    """The registered source name, recorded in the manifest."""
    features: np.ndarray
    """Integer features, shape (rows, num_features)."""
    labels: np.ndarray
    """Integer class labels, shape (rows,)."""
    num_classes: int
    """Labels are expected in 0..num_classes-1."""
    feature_min: int
    """Smallest valid feature value."""
    feature_max: int
    """Largest valid feature value; the reader divides by it to scale to [0, 1]."""
    feature_prefix: str = "feature"
    """Feature columns are named ``<prefix>_<index>``."""
    tokenizer: CharTokenizer | None = None
    """A text source's tokenizer: its features are token ids, stored beside the snapshot."""

    @property
    def sha256(self) -> str:
        """Hash of the raw values (dtype, shape and bytes), independent of how the source ships them."""
        digest = hashlib.sha256()
        for array in (self.features, self.labels):
            contiguous = np.ascontiguousarray(array)
            digest.update(f"{contiguous.dtype.str}{contiguous.shape}".encode())
            digest.update(contiguous.tobytes())
        return digest.hexdigest()


SourceLoader = Callable[[], RawSource]
_SOURCES: dict[str, SourceLoader] = {}


def register_source(name: str) -> Callable[[SourceLoader], SourceLoader]:
    """Register a loader under `name` so `build_snapshot(name, root)` can find it."""

    def decorator(loader: SourceLoader) -> SourceLoader:
        _SOURCES[name] = loader
        return loader

    return decorator


def source_names() -> list[str]:
    return sorted(_SOURCES)


def load_source(name: str) -> RawSource:
    """Load a registered source, or explain which names exist."""
    try:
        loader = _SOURCES[name]
    except KeyError:
        raise SnapshotError(f"unknown dataset source {name!r}; known sources: {', '.join(source_names())}") from None
    return loader()


@register_source("sklearn_digits")
def sklearn_digits() -> RawSource:
    """scikit-learn's bundled 8x8 digits: 1797 images, values 0..16, 10 classes (no download)."""
    from sklearn.datasets import load_digits  # lazy: sklearn import costs about a second

    digits = load_digits()
    return RawSource(
        name="sklearn_digits",
        # The CSV holds small integers stored as float64; int16 keeps them exact and the shards small.
        features=digits.data.astype(np.int16),
        labels=digits.target.astype(np.int64),
        num_classes=10,
        feature_min=0,
        feature_max=16,
        feature_prefix="pixel",
    )


@register_source("python_stdlib_text")
def python_stdlib_text() -> RawSource:
    """1 MiB of the standard library's own source as 129-token windows of a character tokenizer."""
    from training_platform.datasets.text import WINDOW, CharTokenizer, stdlib_corpus, token_windows

    text = stdlib_corpus()
    tokenizer = CharTokenizer.learn(text)
    windows, following = token_windows(text, tokenizer, WINDOW)
    return RawSource(
        name="python_stdlib_text",
        features=windows,
        labels=following,
        num_classes=tokenizer.vocab_size,
        feature_min=0,
        feature_max=tokenizer.vocab_size - 1,
        feature_prefix="tok",
        tokenizer=tokenizer,
    )
