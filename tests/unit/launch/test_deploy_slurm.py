"""deploy/slurm: the cluster script parses, and fills every placeholder of the slurm.conf template."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "slurm"


def test_script_parses():
    subprocess.run(["bash", "-n", str(DEPLOY / "local-cluster.sh")], check=True)


def test_script_fills_every_template_placeholder():
    template = (DEPLOY / "slurm.conf.template").read_text()
    script = (DEPLOY / "local-cluster.sh").read_text()
    settings = "\n".join(line for line in template.splitlines() if not line.startswith("#"))
    assert set(re.findall(r"@([A-Z_]+)@", settings)) == set(re.findall(r"s\|@([A-Z_]+)@\|", script))


def test_template_has_spot_preemptable_by_ondemand_with_requeue():
    lines = (DEPLOY / "slurm.conf.template").read_text().splitlines()
    conf = dict(
        line.split("=", 1) for line in lines if "=" in line and not line.startswith(("#", "NodeName", "PartitionName"))
    )
    assert conf["PreemptType"] == "preempt/partition_prio" and conf["PreemptMode"] == "REQUEUE"
    assert conf["PriorityType"] == "priority/multifactor" and int(conf["PriorityWeightFairshare"]) > 0
    assert conf["GresTypes"] == "gpu"
    partitions = {line.split()[0].split("=")[1]: line for line in lines if line.startswith("PartitionName=")}
    assert "PriorityTier=1 " in partitions["spot"] and "PreemptMode=REQUEUE" in partitions["spot"]
    assert "GraceTime=" in partitions["spot"]
    assert "PriorityTier=10 " in partitions["ondemand"]


def test_status_of_a_cluster_never_brought_up_answers_at_once(tmp_path):
    """Without its slurm.conf a Slurm client retries reading it for 60 s: `status` asks none then (the test session's
    first look at the cluster, on a fresh machine, waited that long)."""
    status = subprocess.run(["bash", str(DEPLOY / "local-cluster.sh"), "status"], capture_output=True, text=True,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TP_SLURM_DIR": str(tmp_path / "never-up")},
                            timeout=20)
    assert status.returncode == 0, status.stderr
    assert "slurmctld: not running (ours)" in status.stdout
    assert f"SLURM_CONF={tmp_path / 'never-up' / 'etc' / 'slurm.conf'}" in status.stdout
