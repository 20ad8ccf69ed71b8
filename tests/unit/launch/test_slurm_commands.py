"""Slurm's client commands as the launcher runs them: a SLURM_CONF that names no file is refused at once."""

from __future__ import annotations

import pytest

from training_platform.errors import LaunchError
from training_platform.launch.slurm_cluster import SlurmCommands


@pytest.mark.parametrize("where", ["config", "environment"])
def test_a_slurm_conf_that_is_no_file_is_named_with_the_fix(tmp_path, monkeypatch, where):
    """A client would retry reading it for 60 s (the launcher's timeout is 30 s) and fail without naming it."""
    missing = tmp_path / "etc" / "slurm.conf"
    if where == "environment":
        monkeypatch.setenv("SLURM_CONF", str(missing))
    commands = SlurmCommands(slurm_conf=str(missing) if where == "config" else None, timeout_s=5)
    with pytest.raises(LaunchError, match=f"SLURM_CONF names {missing}, which is not a file") as refused:
        commands.run(["scontrol", "ping"])
    assert "deploy/slurm/local-cluster.sh up" in str(refused.value)
