"""Rendered Kubernetes objects: valid for Kubernetes 1.31 and shaped for Kueue gang admission."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from training_platform.errors import SpecError
from training_platform.launch.base import RunRequest
from training_platform.launch.k8s_manifests import KubernetesConfig, job_name
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.spec import parse_spec

SPECS = {
    "cpu-1-node": {"resources": {"nodes": 1, "procs_per_node": 2}},
    "gpu-2x4-spot": {"resources": {"nodes": 2, "procs_per_node": 4, "gpus_per_node": 4, "spot": True}},
    "h100-4x8-same-block": {
        "resources": {"nodes": 4, "procs_per_node": 8, "gpus_per_node": 8, "gpu_type": "H100", "priority": "high"},
        "kubernetes": {"placement": "same-block", "secret_refs": ["mlflow-credentials"]},
        "checkpoint": {"grace_period_seconds": 180},
    },
}


def _request(run_id: str, env: dict[str, str] | None = None, **fields) -> RunRequest:
    spec = parse_spec({"name": "resnet", "team": "vision", "owner": "ada", **fields})
    env = {"TP_HOME": "/data", "MLFLOW_TRACKING_URI": "http://mlflow:5000"} if env is None else env
    return RunRequest(spec=spec, run_id=run_id, run_dir=Path("/runs") / run_id, env=env)


def _objects(run_id: str, **fields) -> dict[str, dict]:
    plan = KubernetesLauncher().plan(_request(run_id, **fields))
    return {obj["kind"]: obj for obj in yaml.safe_load_all(plan.files["manifests.yaml"])}


@pytest.mark.parametrize("name", SPECS)
def test_every_rendered_object_validates(name, validate_k8s):
    objects = _objects(name, **SPECS[name])
    assert set(objects) == {"ConfigMap", "Service", "NetworkPolicy", "Job"}
    for obj in objects.values():
        validate_k8s(obj)


def test_strict_validation_catches_an_unknown_field():
    job = _objects("typo", **SPECS["cpu-1-node"])["Job"]
    job["spec"]["replicas"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.31", strict=True)


def test_job_is_an_indexed_gang_for_kueue():
    objects = _objects("gang", **SPECS["h100-4x8-same-block"])
    job, service = objects["Job"], objects["Service"]
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "vision-queue"
    assert labels["kueue.x-k8s.io/priority-class"] == "training-high"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["suspend"]) == (
        "Indexed",
        4,
        4,
        True,
    )
    pod = spec["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    container = pod["containers"][0]
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    name = job["metadata"]["name"]
    assert f"--rdzv-endpoint={name}-0.{name}:29500" in script
    assert "--nnodes=4 --nproc-per-node=8" in script
    assert script.endswith('-m training_platform.train "$RUN_DIR/spec.json" --run-id gang')
    # The worker writes next to its spec: it runs from a writable copy, not the ConfigMap mount.
    copy_then_run = 'cp /etc/training-platform/spec.json "$RUN_DIR/spec.json" && exec python -m '
    copy_then_run += "training_platform.launch.agent"
    assert copy_then_run in script
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RUN_DIR"] == "/data/training-platform/runs/gang" and env["TP_HOME"] == "/data/training-platform"
    subprocess.run(["sh", "-n", "-c", script], check=True)


def test_home_volume_is_a_claim_when_configured():
    config = KubernetesConfig(home_volume_claim="training-home")
    plan = KubernetesLauncher(config).plan(_request("pvc", **SPECS["cpu-1-node"]))
    job = [o for o in yaml.safe_load_all(plan.files["manifests.yaml"]) if o["kind"] == "Job"][0]
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["home"] == {"name": "home", "persistentVolumeClaim": {"claimName": "training-home"}}
    default = _objects("tmp", **SPECS["cpu-1-node"])["Job"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "home", "emptyDir": {}} in default


def test_gpu_type_spot_and_topology_placement():
    h100 = _objects("h100", **SPECS["h100-4x8-same-block"])["Job"]["spec"]["template"]
    pod = h100["spec"]
    assert h100["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-block"
    }
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    on_demand = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert on_demand["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "NotIn"
    assert pod["terminationGracePeriodSeconds"] == 180

    spot = _objects("spot", **SPECS["gpu-2x4-spot"])["Job"]["spec"]["template"]["spec"]
    assert {"key": "training-platform.io/spot", "operator": "Exists", "effect": "NoSchedule"} in spot["tolerations"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in spot["affinity"]["nodeAffinity"]
    assert "nodeSelector" not in spot  # no gpu_type: any GPU model the queue's flavors offer

    preferred = _objects(
        "pref", resources={"nodes": 2}, kubernetes={"placement": "same-rack", "placement_required": False}
    )["Job"]["spec"]["template"]["metadata"]["annotations"]
    assert preferred == {"kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-rack"}


def test_cpu_run_has_no_gpu_request_and_no_topology():
    template = _objects("cpu", **SPECS["cpu-1-node"])["Job"]["spec"]["template"]
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    assert "annotations" not in template["metadata"]


def test_secrets_are_referenced_never_inlined():
    objects = _objects("sec", **SPECS["h100-4x8-same-block"])
    container = objects["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "mlflow-credentials"}}]
    with pytest.raises(SpecError, match="AWS_SECRET_ACCESS_KEY holds or looks like a secret.*kubernetes.secret_refs"):
        KubernetesLauncher().plan(_request("leak", env={"AWS_SECRET_ACCESS_KEY": "hunter2"}))


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("docker.io/someone/trainer:1.0", "kubernetes.image: 'docker.io/someone/trainer:1.0' is not from an approved"),
        ("ghcr.io/training-platform/trainer:latest", "has no fixed tag"),
    ],
)
def test_image_allow_list_guardrail(image, message):
    with pytest.raises(SpecError, match=message):
        KubernetesLauncher().plan(_request("img", kubernetes={"image": image}))
    approved = KubernetesConfig(approved_images=("registry.internal/ml/",))
    plan = KubernetesLauncher(approved).plan(
        _request("ok", kubernetes={"image": "registry.internal/ml/trainer@sha256:" + "a" * 64})
    )
    assert plan.resources["image"].startswith("registry.internal/ml/")


def test_more_gpus_per_node_than_any_node_has_is_refused():
    with pytest.raises(SpecError, match=r"resources.gpus_per_node: 16 GPUs per node .* largest nodes have 8"):
        KubernetesLauncher().plan(_request("big", resources={"gpus_per_node": 16, "procs_per_node": 16}))


def test_job_names_fit_pod_hostnames():
    name = job_name("Sweep_Trial/" + "x" * 80, "a1b2c3")
    assert len(name) <= 50 and name.startswith("tp-sweep-trial-") and name.endswith("-a1b2c3")
    assert job_name("Sweep_Trial/" + "x" * 80, "a1b2c3") == name != job_name("Sweep_Trial/" + "x" * 81, "a1b2c3")


def test_each_attempt_of_a_run_is_its_own_job_removed_a_while_after_it_finishes():
    """A retry, resume or reproduction submits the run again: a fixed `tp-<run id>` met the earlier attempt's Job
    (AlreadyExists), which nothing ever removed."""
    first, again = _objects("resnet-7", **SPECS["cpu-1-node"]), _objects("resnet-7", **SPECS["cpu-1-node"])
    names = {first["Job"]["metadata"]["name"], again["Job"]["metadata"]["name"]}
    assert len(names) == 2 and all(n.startswith("tp-resnet-7-") for n in names), names
    for objects in (first, again):
        job_name_ = objects["Job"]["metadata"]["name"]
        # Everything of an attempt is named by its Job: its pods find each other, and only each other.
        assert objects["Service"]["metadata"]["name"] == job_name_
        assert objects["ConfigMap"]["metadata"]["name"] == f"{job_name_}-spec"
        assert objects["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == {
            "batch.kubernetes.io/job-name": job_name_
        }
        assert objects["Job"]["spec"]["ttlSecondsAfterFinished"] == KubernetesConfig().finished_job_ttl_seconds


def test_plan_renders_without_a_cluster_or_client():
    text = KubernetesLauncher().plan(_request("print", **SPECS["cpu-1-node"])).render()
    assert "kind: Job" in text and "backend: k8s" in text


def test_the_rendezvous_port_admits_only_the_jobs_own_pods():
    objects = _objects("rdzv", **SPECS["gpu-2x4-spot"])
    policy, job = objects["NetworkPolicy"], objects["Job"]
    own_pods = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert policy["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert policy["spec"]["podSelector"] == {"matchLabels": own_pods} and policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": own_pods}}]  # no namespace or address peers
    rendezvous = job["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert "ports" not in rule and rendezvous == 29500  # rendezvous and collectives, from these pods alone
