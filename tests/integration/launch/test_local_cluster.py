"""deploy/slurm/local-cluster.sh on the real machine: `up` is idempotent, `status` shows both partitions."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.fixtures.slurm import SCRIPT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _script(command: str, cluster) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TP_SLURM_DIR": str(cluster.state_dir)}
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, env=env, timeout=100)


def test_up_again_is_a_no_op(slurm_cluster):
    pids = (slurm_cluster.state_dir / "run" / "slurmctld.pid").read_text()
    again = _script("up", slurm_cluster)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert (slurm_cluster.state_dir / "run" / "slurmctld.pid").read_text() == pids


def test_status_shows_spot_and_ondemand_with_fake_gpus(slurm_cluster):
    status = _script("status", slurm_cluster)
    host = socket.gethostname().split(".")[0]
    assert "slurmctld: running" in status.stdout and f"slurmd {host}: running" in status.stdout
    if (slurm_cluster.state_dir / "run" / "namespace-nodes").read_text().strip() == "2":  # up --nodes 2 (root)
        assert "slurmd tp-node0: running" in status.stdout and "slurmd tp-node1: running" in status.stdout
    partitions = slurm_cluster.run("scontrol", "show", "partition", "-o").stdout
    assert "PartitionName=spot" in partitions and "PreemptMode=REQUEUE" in partitions
    assert "PartitionName=ondemand" in partitions and "PriorityTier=10" in partitions
    assert "Gres=gpu:4" in slurm_cluster.run("scontrol", "show", "node", "-o").stdout
