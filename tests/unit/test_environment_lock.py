"""The environment lock is read once per process, and again once a distribution is installed or removed."""

from __future__ import annotations

import sys
from importlib import metadata

from training_platform.runs.lineage import environment_lock


def _install(site, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_lock_is_read_once_until_a_distribution_is_installed_or_removed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    reads = []
    real = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda: reads.append(1) or real())

    first = environment_lock()
    assert environment_lock() == first
    assert len(reads) == 1
    assert not any(line.startswith("tp_lock_probe==") for line in first)

    _install(site, "tp_lock_probe", "1.0")
    assert "tp_lock_probe==1.0" in environment_lock()
    assert len(reads) == 2

    (site / "tp_lock_probe-1.0.dist-info" / "METADATA").unlink()
    (site / "tp_lock_probe-1.0.dist-info").rmdir()
    _install(site, "tp_lock_probe", "2.0")
    lock = environment_lock()
    assert "tp_lock_probe==2.0" in lock and "tp_lock_probe==1.0" not in lock
    assert len(reads) == 3


def test_a_directory_named_as_the_working_directory_or_by_its_path_is_read_once(tmp_path, monkeypatch):
    """The code server's fork server has its working directory as "" on its path; each run's process, its fork,
    names it: the lock the fork server read serves the run."""
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "tp_lock_probe", "1.0")
    monkeypatch.chdir(site)
    monkeypatch.syspath_prepend("")
    reads = []
    real = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda: reads.append(1) or real())

    first = environment_lock()
    assert "tp_lock_probe==1.0" in first
    monkeypatch.setattr(sys, "path", [str(site) if entry == "" else entry for entry in sys.path])
    assert environment_lock() == first
    assert len(reads) == 1
