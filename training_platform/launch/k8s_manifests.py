"""Render one run as Kubernetes objects that Kueue admits as a gang.

Why an Indexed batch/v1 Job and not a JobSet: a training run is one homogeneous group of pods,
which Kueue already admits all-or-nothing as a single Workload; an Indexed Job gives each pod a
stable index and hostname (`<job>-<index>.<service>`) for the torchrun rendezvous, and needs no
controller beyond Kubernetes and Kueue. Whole-group restarts, JobSet's main extra, come from
torchrun's elastic agent here (`--max-restarts`): when a pod is replaced, the survivors
re-rendezvous and every worker resumes from the newest checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training_platform.errors import SpecError
from training_platform.launch.base import AGENT_MODULE, RunRequest
from training_platform.paths import RUN_STORE_ENV
from training_platform.redaction import Redactor
from training_platform.spec import ResourceRequest, TrainSpec

SPEC_MOUNT = "/etc/training-platform"
RDZV_PORT = 29500
# Environment names that look like credentials: these must come from a Secret (kubernetes.secret_refs).
_SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.IGNORECASE)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class KubernetesConfig(BaseModel):
    """How specs map onto this Kubernetes cluster with Kueue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approved_images: tuple[str, ...] = Field(
        ("ghcr.io/training-platform/trainer:",),
        description="image prefixes (registry/repository[:]) a run may use; anything else is refused",
    )
    default_image: str = Field("ghcr.io/training-platform/trainer:0.1.0", description="image when the spec names none")
    queue_template: str = Field("{team}-queue", description="LocalQueue when the spec names none")
    namespace_template: str = Field("{team}", description="namespace when the spec names none")
    priority_classes: dict[str, str] = Field(
        default_factory=lambda: {"low": "training-low", "normal": "training-normal", "high": "training-high"},
        description="Kueue WorkloadPriorityClass per resources.priority",
    )
    gpu_product_label: str = Field("nvidia.com/gpu.product", description="node label naming the GPU model")
    gpu_products: dict[str, str] = Field(
        default_factory=lambda: {
            "T4": "Tesla-T4",
            "A10G": "NVIDIA-A10G",
            "L4": "NVIDIA-L4",
            "L40S": "NVIDIA-L40S",
            "A100-40GB": "NVIDIA-A100-SXM4-40GB",
            "A100-80GB": "NVIDIA-A100-SXM4-80GB",
            "H100": "NVIDIA-H100-80GB-HBM3",
            "H200": "NVIDIA-H200",
        },
        description="value of gpu_product_label per resources.gpu_type",
    )
    max_gpus_per_node: int = Field(8, ge=1, description="GPUs of the largest node; more per node is refused")
    capacity_label: str = Field("training-platform.io/capacity-type", description="node label: 'spot' or 'on-demand'")
    spot_taint_key: str = Field("training-platform.io/spot", description="taint on spot nodes that spot runs tolerate")
    topology_levels: dict[str, str] = Field(
        default_factory=lambda: {
            "same-rack": "cloud.provider.com/topology-rack",
            "same-block": "cloud.provider.com/topology-block",
        },
        description="node label of each placement level (the levels of the Kueue Topology)",
    )
    cpus_per_proc: int = Field(2, ge=1, description="CPU cores requested per worker process")
    memory_per_proc_gib: int = Field(8, ge=1, description="memory (GiB) requested per worker process")
    max_restarts: int = Field(3, ge=0, description="torchrun re-rendezvous attempts after a pod is replaced")
    backoff_limit: int = Field(3, ge=0, description="failed pods (not counting disruptions) before the Job fails")
    finished_job_ttl_seconds: int = Field(
        86400, ge=0, description="seconds a finished Job (and its pods, ConfigMap, Service) stays for inspection"
    )
    worker_module: str = Field("training_platform.train", description="module torchrun starts on each rank")
    home_volume_claim: str | None = Field(
        None,
        description="ReadWriteMany PersistentVolumeClaim used as TP_HOME (snapshots, run dirs); "
        "default: a per-pod emptyDir, with checkpoints going to the spec's s3:// store",
    )
    home_mount_path: str = Field("/data/training-platform", description="where TP_HOME is mounted in pods")
    run_store_uri: str | None = Field(
        default_factory=lambda: os.environ.get(RUN_STORE_ENV) or None,
        description="where pods without a shared home push their run's files (events, result, Pipes messages) "
        "for the Dagster side to pull: s3://bucket/runs; default: TP_RUN_STORE_URI",
    )

    @property
    def pushes_run_files(self) -> bool:
        """Whether pods hand their run's files over through the run store (they share no home with Dagster)."""
        return self.home_volume_claim is None


def job_name(run_id: str, attempt: str) -> str:
    """`tp-<run>-<attempt>`: a DNS-1123 name short enough for `<name>-<index>` pod hostnames (63 characters), and
    new for each attempt, so that a retry, a resume or a reproduction of the run never meets an earlier Job."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    if len(slug) > 36:
        slug = f"{slug[:27].rstrip('-')}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"
    return f"tp-{slug}-{attempt}"


def new_attempt() -> str:
    """A short token naming one submission of a run (its Job and the objects the Job owns)."""
    return secrets.token_hex(3)


def check_request(request: RunRequest, config: KubernetesConfig) -> None:
    """Refuse (SpecError) what must never reach the API server."""
    spec, res = request.spec, request.spec.resources
    image = spec.kubernetes.image or config.default_image
    if not any(image.startswith(prefix) for prefix in config.approved_images):
        raise SpecError(
            f"kubernetes.image: {image!r} is not from an approved registry; use an image starting with one "
            f"of: {', '.join(config.approved_images)} (or ask the platform team to approve it)"
        )
    if image.endswith(":latest") or ("@" not in image and ":" not in image.rsplit("/", 1)[-1]):
        raise SpecError(f"kubernetes.image: {image!r} has no fixed tag; pin a version tag or a digest")
    if res.gpus_per_node > config.max_gpus_per_node:
        raise SpecError(
            f"resources.gpus_per_node: {res.gpus_per_node} GPUs per node requested but the largest nodes have "
            f"{config.max_gpus_per_node}; lower resources.gpus_per_node and raise resources.nodes"
        )
    if res.gpu_type and res.gpu_type not in config.gpu_products:
        raise SpecError(
            f"resources.gpu_type: no node pool offers {res.gpu_type!r} on this cluster; use one of: "
            f"{', '.join(config.gpu_products)}"
        )
    if spec.kubernetes.placement != "none" and spec.kubernetes.placement not in config.topology_levels:
        raise SpecError(
            f"kubernetes.placement: {spec.kubernetes.placement!r} is not a topology level of this cluster; "
            f"use none or one of: {', '.join(config.topology_levels)}"
        )
    for name in (namespace_of(request, config), queue_of(request, config), *spec.kubernetes.secret_refs):
        if not _DNS_LABEL.match(name) or len(name) > 63:
            raise SpecError(f"kubernetes: {name!r} is not a valid Kubernetes name; use lowercase letters, digits, -")
    # By name and by content: MLFLOW_TRACKING_URI=https://user:pass@... has an innocent name.
    redactor = Redactor()
    leaked = sorted(
        key for key, value in request.env.items() if _SECRET_NAME.search(key) or redactor.first_secret(value)
    )
    if leaked:
        raise SpecError(
            f"environment {', '.join(leaked)} holds or looks like a secret and would be written into the Job; put "
            "it in a Kubernetes Secret and name that Secret in kubernetes.secret_refs (MLflow: "
            "MLFLOW_TRACKING_USERNAME/PASSWORD from a Secret, not user:password@ in the URI)"
        )


def namespace_of(request: RunRequest, config: KubernetesConfig) -> str:
    return request.spec.kubernetes.namespace or config.namespace_template.format(team=request.spec.team)


def queue_of(request: RunRequest, config: KubernetesConfig) -> str:
    return request.spec.kubernetes.queue or config.queue_template.format(team=request.spec.team)


def render_objects(request: RunRequest, config: KubernetesConfig, attempt: str) -> list[dict[str, Any]]:
    """ConfigMap (the spec), headless Service (rendezvous), NetworkPolicy and the Indexed Job of one attempt.

    The Job comes last; the launcher creates it first, then the others owned by it, so that the Job's TTL after
    it finishes removes them all."""
    check_request(request, config)
    name = job_name(request.run_id, attempt)
    namespace = namespace_of(request, config)
    labels = {
        "app.kubernetes.io/name": "training-platform",
        "app.kubernetes.io/component": "training-run",
        "training-platform.io/run-id": re.sub(r"[^A-Za-z0-9_.-]", "-", request.run_id)[:63].strip("-_."),
        "training-platform.io/team": request.spec.team,
    }
    meta = {"name": name, "namespace": namespace, "labels": labels}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-spec"},
        "data": {"spec.json": request.spec.model_dump_json(indent=2)},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            # Rendezvous starts before pods are Ready; their DNS names must resolve already.
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "rendezvous", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }
    return [config_map, service, _network_policy(name, meta), _job(request, config, name, meta)]


def _network_policy(name: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Only the Job's own pods reach its pods: the rendezvous store (which unpickles what it reads) and
    the collectives' ports. deploy/kubernetes/network-policy.yaml denies everything else to training pods."""
    own_pods = {"matchLabels": {"batch.kubernetes.io/job-name": name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods}]}],
        },
    }


def _job(request: RunRequest, config: KubernetesConfig, name: str, meta: dict[str, Any]) -> dict[str, Any]:
    res = request.spec.resources
    job_labels = {**meta["labels"], "kueue.x-k8s.io/queue-name": queue_of(request, config)}
    priority_class = config.priority_classes.get(res.priority)
    if priority_class:
        job_labels["kueue.x-k8s.io/priority-class"] = priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**meta, "labels": job_labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": res.nodes,
            "parallelism": res.nodes,
            # Kueue unsuspends the Job once the whole gang fits (it also suspends it on creation).
            "suspend": True,
            "backoffLimit": config.backoff_limit,
            "ttlSecondsAfterFinished": config.finished_job_ttl_seconds,
            "podFailurePolicy": {
                "rules": [
                    # Preemption, eviction or a reclaimed spot node is not the run's fault.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": _pod_template(request, config, name, meta),
        },
    }


def _pod_template(request: RunRequest, config: KubernetesConfig, name: str, meta: dict[str, Any]) -> dict[str, Any]:
    spec, res = request.spec, request.spec.resources
    annotations = {}
    if spec.kubernetes.placement != "none":
        key = "podset-required-topology" if spec.kubernetes.placement_required else "podset-preferred-topology"
        annotations[f"kueue.x-k8s.io/{key}"] = config.topology_levels[spec.kubernetes.placement]
    cpus = res.procs_per_node * config.cpus_per_proc
    memory = f"{res.procs_per_node * config.memory_per_proc_gib}Gi"
    limits: dict[str, Any] = {"cpu": str(cpus), "memory": memory}
    if res.gpus_per_node:
        limits["nvidia.com/gpu"] = str(res.gpus_per_node)
    # The worker keeps its run directory next to the spec file (events, result, preemption
    # marker), so the spec is copied from the read-only ConfigMap into a writable run dir.
    torchrun = [
        "python",
        "-m",
        AGENT_MODULE,
        f"--nnodes={res.nodes}",
        f"--nproc-per-node={res.procs_per_node}",
        f"--max-restarts={config.max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{name}:{RDZV_PORT}",
        f"--rdzv-id={name}",
        "-m",
        config.worker_module,
    ]
    script = (
        f'mkdir -p "$RUN_DIR" && cp {SPEC_MOUNT}/spec.json "$RUN_DIR/spec.json" && exec '
        + shlex.join(torchrun)
        + f' "$RUN_DIR/spec.json" --run-id {shlex.quote(request.run_id)}'
    )
    command = ["/bin/sh", "-c", script]
    home = config.home_mount_path
    env_vars = {**request.env, "TP_HOME": home, "RUN_DIR": f"{home}/runs/{request.run_id}"}
    if config.pushes_run_files and config.run_store_uri:
        env_vars[RUN_STORE_ENV] = config.run_store_uri
    env = [{"name": key, "value": value} for key, value in sorted(env_vars.items())]
    container: dict[str, Any] = {
        "name": "trainer",
        "image": spec.kubernetes.image or config.default_image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "ports": [{"name": "rendezvous", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(limits), "limits": limits},
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "home", "mountPath": home},
            # NCCL and DataLoader workers share memory through /dev/shm; the default 64 MiB is too small.
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if spec.kubernetes.secret_refs:
        container["envFrom"] = [{"secretRef": {"name": ref}} for ref in spec.kubernetes.secret_refs]
    pod_spec: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",
        # SIGTERM on eviction, then this long to write the emergency checkpoint before SIGKILL.
        "terminationGracePeriodSeconds": spec.checkpoint.grace_period_seconds,
        "containers": [container],
        "volumes": [
            {"name": "spec", "configMap": {"name": f"{name}-spec"}},
            {"name": "home", **_home_volume(config)},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if spec.kubernetes.service_account:
        pod_spec["serviceAccountName"] = spec.kubernetes.service_account
    pod_spec["automountServiceAccountToken"] = False
    node_selector, tolerations, affinity = _placement(request.spec.resources, config)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if affinity:
        pod_spec["affinity"] = affinity
    template_meta: dict[str, Any] = {"labels": meta["labels"]}
    if annotations:
        template_meta["annotations"] = annotations
    return {"metadata": template_meta, "spec": pod_spec}


def _home_volume(config: KubernetesConfig) -> dict[str, Any]:
    if config.home_volume_claim:
        return {"persistentVolumeClaim": {"claimName": config.home_volume_claim}}
    return {"emptyDir": {}}


def on_demand_patch(spec: TrainSpec, config: KubernetesConfig) -> dict[str, Any]:
    """The patch that moves a suspended Job's pods to on-demand nodes: its tolerations and node affinity as an
    on-demand run's (a suspended Job's scheduling directives are mutable; Kueue admits it again)."""
    _, tolerations, affinity = _placement(spec.resources.model_copy(update={"spot": False}), config)
    # Explicit null: a strategic merge would otherwise keep the spot preference beside the new requirement.
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = None
    return {"spec": {"template": {"spec": {"tolerations": tolerations, "affinity": affinity}}}}


def _placement(
    res: ResourceRequest, config: KubernetesConfig
) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, Any]]:
    node_selector = {}
    tolerations: list[dict[str, Any]] = []
    if res.gpus_per_node:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        if res.gpu_type:
            node_selector[config.gpu_product_label] = config.gpu_products[res.gpu_type]
    if res.spot:
        # Spot runs may land on spot or on-demand nodes (Kueue's flavor order decides) and prefer spot.
        tolerations.append({"key": config.spot_taint_key, "operator": "Exists", "effect": "NoSchedule"})
        affinity = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [{"key": config.capacity_label, "operator": "In", "values": ["spot"]}]
                        },
                    }
                ]
            }
        }
    else:
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": config.capacity_label, "operator": "NotIn", "values": ["spot"]}]}
                    ]
                }
            }
        }
    return node_selector, tolerations, affinity
