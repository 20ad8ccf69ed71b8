"""The preemption policy on recorded Kubernetes objects: evictions are followed, never resubmitted."""

from pathlib import Path

import pytest
import yaml

from training_platform.launch.k8s_status import job_status
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.launch.local import LocalLauncher
from training_platform.recovery.preemption import Recovery, decide, summarize
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


class _Replay:
    """A launcher whose job goes through recorded API states, one per poll."""

    def __init__(self, scenarios: list[str], keeps: bool):
        self.statuses = [_status(name) for name in scenarios]
        self.keeps_preempted_jobs = keeps
        self.polled = 0

    def status(self, handle):
        self.polled += 1
        return self.statuses[min(self.polled, len(self.statuses)) - 1]

    def wait(self, handle, timeout):
        pass

    def move_to_on_demand(self, handle, spec):
        return None

    def release_requeue_hold(self, handle):
        return None


def _wait(launcher: _Replay, tmp_path) -> str:
    from types import SimpleNamespace

    from resources.launcher import LauncherResource
    from training_platform.launch.base import JobHandle, RunRequest
    from training_platform.runs.events import RunEvents
    from training_platform.runs.remote_files import RunFilesPuller

    log = SimpleNamespace(warning=lambda *_: None, debug=lambda *_: None, info=lambda *_: None)
    request = RunRequest(spec=SPEC, run_id="resnet-0007", run_dir=tmp_path)
    live = SimpleNamespace(poll=lambda final=False: None)
    status = LauncherResource()._wait(SimpleNamespace(log=log), launcher, JobHandle("k8s", "vision/tp-resnet-0007",
                                      "resnet-0007"), live, request, RunEvents(tmp_path),
                                      RunFilesPuller(None, "resnet-0007", tmp_path, "dagster-run"))
    return status.state.value


EVICTED_THEN_DONE = ["running", "evicted_by_preemption", "requeued_after_preemption", "running_again_after_preemption",
                     "succeeded"]


def test_the_training_asset_waits_through_a_kueue_eviction_for_the_requeued_job_to_finish(tmp_path):
    """It used to stop waiting at the eviction: the requeued Job then finished with nobody to materialize the run."""
    launcher = _Replay(EVICTED_THEN_DONE, keeps=True)
    assert _wait(launcher, tmp_path) == "SUCCEEDED" and launcher.polled == len(EVICTED_THEN_DONE)


def test_a_launcher_whose_preempted_job_is_gone_stops_waiting_at_the_preemption(tmp_path):
    launcher = _Replay(EVICTED_THEN_DONE, keeps=False)
    assert _wait(launcher, tmp_path) == "PREEMPTED" and launcher.polled == 2
