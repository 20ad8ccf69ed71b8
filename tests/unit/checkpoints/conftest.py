"""Small chunks in unit tests, so chunking and packing are exercised with small tensors."""

from __future__ import annotations

import pytest

from training_platform.checkpoints import writer


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(writer, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(writer, "PACK_BELOW_BYTES", 1024)
    monkeypatch.setattr(writer, "PACK_BYTES", 4096)
    monkeypatch.setattr(writer, "MIN_SETTLE_SECONDS", 0.0)


@pytest.fixture
def loose_chunks(monkeypatch):
    """Every chunk in an object of its own, as on S3 (packs.py): for tests that damage or count chunk files."""
    monkeypatch.setattr(writer, "packs_supported", lambda storage: False)
