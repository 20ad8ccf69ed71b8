"""The preemption policy on recorded Kubernetes objects: evictions are followed, never resubmitted."""

from pathlib import Path

import pytest
import yaml

from training_platform.launch.k8s_status import job_status
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.launch.local import LocalLauncher
from training_platform.preemption import Recovery, decide, summarize
from training_platform.spec import parse_spec

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "k8s_recorded"
SPEC = parse_spec({"name": "r", "team": "t", "owner": "o", "resources": {"spot": True}})


def _status(name: str):
    recorded = yaml.safe_load((RECORDED / f"{name}.yaml").read_text())
    return job_status(recorded["job"], recorded["workload"], recorded["pods"])


@pytest.mark.parametrize(
    ("scenario", "action"),
    [
        ("evicted_by_preemption", Recovery.FOLLOW),  # Kueue suspends the Job and requeues it
        ("requeued_after_preemption", Recovery.FOLLOW),
        ("spot_node_reclaimed", Recovery.FOLLOW),  # the Job controller replaces the lost pods
        ("running_again_after_preemption", Recovery.FOLLOW),
        ("failed", Recovery.NONE),  # not a preemption: the run-status sensor's business
        ("succeeded", Recovery.NONE),
    ],
)
def test_kubernetes_preemptions_are_followed(scenario, action):
    keeps = KubernetesLauncher.keeps_preempted_jobs
    assert decide(SPEC, _status(scenario), summarize([]), engine_keeps_job=keeps).action == action


def test_the_same_eviction_on_a_launcher_whose_job_is_gone_is_resumed():
    keeps = getattr(LocalLauncher, "keeps_preempted_jobs", False)
    assert decide(SPEC, _status("evicted_by_preemption"), summarize([]), engine_keeps_job=keeps).action == (
        Recovery.RESUME
    )
