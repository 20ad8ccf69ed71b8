"""Snapshot fixtures: one real build per session, copied where a test damages it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from training_platform.datasets import SnapshotManifest, build_snapshot


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SnapshotManifest]:
    """A digits snapshot shared read-only by the session's tests."""
    root = tmp_path_factory.mktemp("snapshots")
    return root, build_snapshot("sklearn_digits", root)


@pytest.fixture
def scratch(built: tuple[Path, SnapshotManifest], tmp_path: Path) -> tuple[Path, SnapshotManifest]:
    """A private copy of the session snapshot that a test may corrupt."""
    root, manifest = built
    copy = tmp_path / "snapshots"
    shutil.copytree(root, copy)
    return copy, manifest
