"""KubernetesLauncher against fake API classes: what it creates, how it reads state, how it fails."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from training_platform.errors import LaunchError, SpecError
from training_platform.launch.base import JobHandle, JobState, RunRequest
from training_platform.launch.k8s_manifests import KubernetesConfig
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.spec import parse_spec

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "k8s_recorded"


def _api_error(status: int, body: str) -> ApiException:
    error = ApiException(status=status, reason="Forbidden" if status == 403 else "Not Found")
    error.body = body
    return error


class FakeBatch:
    def __init__(self, job=None, create_error=None):
        self.job, self.create_error, self.created, self.deleted = job, create_error, [], []

    def create_namespaced_job(self, namespace, body):
        if self.create_error:
            raise self.create_error
        self.created.append((namespace, body))
        return SimpleNamespace(metadata=SimpleNamespace(name=body["metadata"]["name"], uid="uid-1"))

    def read_namespaced_job(self, name, namespace):
        if self.job is None:
            raise _api_error(404, "not found")
        return self.job

    def delete_namespaced_job(self, name, namespace, propagation_policy):
        self.deleted.append((namespace, name, propagation_policy))

    def patch_namespaced_job(self, name, namespace, body):
        self.patched = (namespace, name, body)


class FakeCore:
    def __init__(self, pods=()):
        self.pods, self.created = list(pods), []

    def create_namespaced_config_map(self, namespace, body):
        self.created.append(body)

    def create_namespaced_service(self, namespace, body):
        self.created.append(body)

    def list_namespaced_pod(self, namespace, label_selector):
        return SimpleNamespace(items=self.pods)


class FakeCustom:
    def __init__(self, queues=("vision-queue",), workloads=()):
        self.queues, self.workloads, self.selectors = queues, list(workloads), []

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.queues:
            raise _api_error(404, "not found")
        return {"metadata": {"name": name}}

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=None):
        self.selectors.append((plural, label_selector))
        if plural == "localqueues":
            return {"items": [{"metadata": {"name": q}} for q in self.queues]}
        return {"items": self.workloads}


class FakeNetworking:
    def __init__(self):
        self.created = []

    def create_namespaced_network_policy(self, namespace, body):
        self.created.append((namespace, body))


RUN_STORE = "s3://training-platform/runs"


def _launcher(monkeypatch, core, batch, custom, networking=None, **config) -> KubernetesLauncher:
    launcher = KubernetesLauncher(KubernetesConfig(**{"run_store_uri": RUN_STORE, **config}), api_client=ApiClient())
    monkeypatch.setattr(launcher, "_apis", lambda: (core, batch, custom))
    monkeypatch.setattr(launcher, "_networking", lambda: networking or FakeNetworking())
    return launcher


def _plan(launcher: KubernetesLauncher, **fields):
    spec = parse_spec({"name": "resnet", "team": "vision", "owner": "ada", **fields})
    return launcher.plan(RunRequest(spec=spec, run_id="resnet-7", run_dir=Path("/runs/resnet-7")))


def test_submit_creates_job_then_owned_configmap_service_and_network_policy(monkeypatch):
    core, batch, networking = FakeCore(), FakeBatch(), FakeNetworking()
    launcher = _launcher(monkeypatch, core, batch, FakeCustom(), networking)
    handle = launcher.submit(_plan(launcher))
    namespace, name = handle.job_id.split("/")
    assert namespace == "vision" and re.fullmatch(r"tp-resnet-7-[0-9a-f]{6}", name), handle.job_id
    ((namespace, job),) = batch.created
    assert namespace == "vision" and job["kind"] == "Job"
    assert [o["kind"] for o in core.created] == ["ConfigMap", "Service"]
    ((namespace, policy),) = networking.created
    assert namespace == "vision" and policy["kind"] == "NetworkPolicy"
    for obj in [*core.created, policy]:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_pods_hand_their_run_files_over_through_the_run_store_unless_the_home_is_shared(monkeypatch):
    launcher = _launcher(monkeypatch, FakeCore(), FakeBatch(), FakeCustom())
    (job,) = [o for o in yaml.safe_load_all(_plan(launcher).files["manifests.yaml"]) if o["kind"] == "Job"]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TP_RUN_STORE_URI"] == RUN_STORE
    assert launcher.run_store.uri == RUN_STORE

    shared = _launcher(monkeypatch, FakeCore(), FakeBatch(), FakeCustom(), home_volume_claim="training-home")
    (job,) = [o for o in yaml.safe_load_all(_plan(shared).files["manifests.yaml"]) if o["kind"] == "Job"]
    assert "TP_RUN_STORE_URI" not in {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert shared.run_store is None  # one run directory, read by both sides


def test_a_pod_with_no_shared_home_and_no_run_store_is_refused_before_anything_is_created(monkeypatch):
    monkeypatch.delenv("TP_RUN_STORE_URI", raising=False)
    batch = FakeBatch()
    launcher = _launcher(monkeypatch, FakeCore(), batch, FakeCustom(), run_store_uri=None)
    with pytest.raises(LaunchError, match=r"share no home with the Dagster side: set TP_RUN_STORE_URI .*home_volume"):
        launcher.submit(_plan(launcher))
    assert batch.created == []


def test_unknown_queue_is_refused_before_anything_is_created(monkeypatch):
    batch = FakeBatch()
    launcher = _launcher(monkeypatch, FakeCore(), batch, FakeCustom(queues=("vision-queue",)))
    with pytest.raises(SpecError, match=r"kubernetes.queue: LocalQueue 'gpu-rush' does not exist .*vision-queue"):
        launcher.submit(_plan(launcher, kubernetes={"queue": "gpu-rush"}))
    assert batch.created == []


def test_api_refusal_is_surfaced_verbatim(monkeypatch):
    body = '{"kind":"Status","message":"jobs.batch is forbidden: User cannot create resource"}'
    launcher = _launcher(monkeypatch, FakeCore(), FakeBatch(create_error=_api_error(403, body)), FakeCustom())
    with pytest.raises(
        LaunchError, match=r"(?s)refused to create the Job \(HTTP 403 Forbidden\):\n.*is forbidden.*RBAC"
    ):
        launcher.submit(_plan(launcher))


def test_status_reads_job_workload_and_pods(monkeypatch):
    recorded = yaml.safe_load((RECORDED / "evicted_by_preemption.yaml").read_text())
    custom = FakeCustom(workloads=[recorded["workload"]])
    launcher = _launcher(monkeypatch, FakeCore(recorded["pods"]), FakeBatch(job=recorded["job"]), custom)
    status = launcher.status(JobHandle("k8s", "vision/tp-resnet-0007", "resnet-0007"))
    assert status.state is JobState.PREEMPTED and status.preemptions == 1
    assert ("workloads", f"kueue.x-k8s.io/job-uid={recorded['job']['metadata']['uid']}") in custom.selectors


def test_cancel_deletes_the_job_in_the_foreground_and_then_reads_cancelled(monkeypatch):
    batch = FakeBatch()
    launcher = _launcher(monkeypatch, FakeCore(), batch, FakeCustom())
    handle = JobHandle("k8s", "vision/tp-resnet-7", "resnet-7")
    launcher.cancel(handle)
    assert batch.deleted == [("vision", "tp-resnet-7", "Foreground")]
    assert launcher.status(handle).state is JobState.CANCELLED


@pytest.mark.parametrize("suspended", [True, False])
def test_an_evicted_spot_job_is_moved_to_on_demand_nodes_while_suspended(monkeypatch, suspended):
    batch = FakeBatch(job=SimpleNamespace(spec=SimpleNamespace(suspend=suspended)))
    launcher = _launcher(monkeypatch, FakeCore(), batch, FakeCustom())
    spec = parse_spec({"name": "resnet", "team": "vision", "owner": "ada", "resources": {"spot": True}})

    done = launcher.move_to_on_demand(JobHandle("k8s", "vision/tp-resnet-7", "resnet-7"), spec)

    if not suspended:  # a running Job's pods cannot move; it moves at its next eviction
        assert done is None and not hasattr(batch, "patched")
        return
    namespace, name, body = batch.patched
    assert (namespace, name) == ("vision", "tp-resnet-7") and "on-demand" in done
    pod = body["spec"]["template"]["spec"]
    assert not [t for t in pod["tolerations"] if "spot" in t["key"]]
    affinity = pod["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["operator"] == "NotIn" and term["matchExpressions"][0]["values"] == ["spot"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] is None  # the spot preference removed


def test_a_users_script_reaches_the_pod_inside_its_specs_configmap(monkeypatch, tmp_path):
    from training_platform.spec import with_script_code

    (tmp_path / "train.py").write_text("print('my own loop')\n")
    launcher = _launcher(monkeypatch, FakeCore(), FakeBatch(), FakeCustom())
    spec = with_script_code(
        parse_spec({"name": "own", "team": "vision", "owner": "ada", "entrypoint": {"script": "train.py"}}), tmp_path
    )
    plan = launcher.plan(RunRequest(spec=spec, run_id="own-1", run_dir=Path("/runs/own-1")))
    (config_map,) = [o for o in yaml.safe_load_all(plan.files["manifests.yaml"]) if o["kind"] == "ConfigMap"]
    shipped = parse_spec(yaml.safe_load(config_map["data"]["spec.json"])).entrypoint.code
    assert shipped.text == "print('my own loop')\n" and shipped == spec.entrypoint.code


def test_a_jobs_last_durable_checkpoint_is_annotated_on_it_and_while_fresh_lowers_its_priority(monkeypatch):
    import time as clock

    from training_platform.checkpoints.durable import DurableCheckpoint

    job = {"metadata": {"name": "tp-resnet-7-a1b2c3", "labels": {"kueue.x-k8s.io/priority-class": "training-normal"}}}
    batch = FakeBatch(job=job)
    launcher = _launcher(monkeypatch, FakeCore(), batch, FakeCustom())
    handle = JobHandle("k8s", "vision/tp-resnet-7-a1b2c3", "resnet-7")
    launcher.publish_checkpoint(handle, DurableCheckpoint(300, 0.0))  # saved long ago: its class stays its own
    assert batch.patched == ("vision", "tp-resnet-7-a1b2c3", {"metadata": {"annotations": {
        "training-platform.io/checkpoint-step": "300",
        "training-platform.io/checkpoint-saved-at": "1970-01-01T00:00:00Z",
    }}})

    launcher.publish_checkpoint(handle, DurableCheckpoint(400, clock.time() - 5))  # just saved: first to go
    assert batch.patched[2]["metadata"]["labels"] == {"kueue.x-k8s.io/priority-class": "training-normal-checkpointed"}

    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "training-normal-checkpointed"
    launcher.publish_checkpoint(handle, DurableCheckpoint(400, clock.time() - 3600))  # that save grew old
    assert batch.patched[2]["metadata"]["labels"] == {"kueue.x-k8s.io/priority-class": "training-normal"}
