"""KubernetesLauncher: submit a run as a Kueue-admitted Indexed Job and watch it.

Rendering lives in `k8s_manifests`, the state mapping in `k8s_status`; this module only talks
to the API server. The `kubernetes` client is imported on first use, so rendering (`tp render`)
works without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml

from training_platform.checkpoints.backends import open_storage
from training_platform.checkpoints.durable import PRIORITY_CLASS_LABEL, DurableCheckpoint
from training_platform.checkpoints.storage import Storage
from training_platform.errors import LaunchError, SpecError
from training_platform.launch.base import JobHandle, JobStatus, LaunchPlan, RunRequest
from training_platform.launch.k8s_manifests import (
    KubernetesConfig,
    job_name,
    namespace_of,
    new_attempt,
    on_demand_patch,
    queue_of,
    render_objects,
)
from training_platform.launch.k8s_status import job_status
from training_platform.paths import RUN_STORE_ENV
from training_platform.spec import TrainSpec

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"


class KubernetesLauncher:
    """Plans, submits and watches training runs on Kubernetes with Kueue."""

    name = "k8s"
    # A preempted Job is not gone: Kueue suspends and requeues it, the Job controller replaces pods
    # lost with a spot node. The preemption sensor follows it instead of resubmitting.
    keeps_preempted_jobs = True

    def __init__(self, config: KubernetesConfig | None = None, api_client: Any = None) -> None:
        self.config = config or KubernetesConfig()
        self._api_client = api_client

    @property
    def run_store(self) -> Storage | None:
        """Where the pods push their run's files for the Dagster side to pull (runs/remote_files.py); None with a shared
        home, where both sides read the same run directory."""
        if not self.config.pushes_run_files or not self.config.run_store_uri:
            return None
        return open_storage(self.config.run_store_uri)

    def plan(self, request: RunRequest) -> LaunchPlan:
        attempt = new_attempt()
        objects = render_objects(request, self.config, attempt)
        job = objects[-1]
        container = job["spec"]["template"]["spec"]["containers"][0]
        return LaunchPlan(
            backend=self.name,
            run_id=request.run_id,
            command=container["command"],
            env=dict(request.env),
            workdir=request.run_dir,
            resources={
                "namespace": namespace_of(request, self.config),
                "queue": queue_of(request, self.config),
                "job": job_name(request.run_id, attempt),
                "nodes": request.spec.resources.nodes,
                "procs_per_node": request.spec.resources.procs_per_node,
                "gpus_per_node": request.spec.resources.gpus_per_node,
                "image": container["image"],
            },
            files={"manifests.yaml": yaml.safe_dump_all(objects, sort_keys=False)},
        )

    # -- the API server --------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._api_client is None:
            try:
                from kubernetes import client, config
            except ImportError:
                raise LaunchError("the `kubernetes` package is missing; pip install kubernetes") from None
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, FileNotFoundError) as exc:
                    raise LaunchError(
                        f"no Kubernetes credentials: {exc}; set KUBECONFIG or run inside the cluster"
                    ) from None
            self._api_client = client.ApiClient()
        return self._api_client

    def _apis(self) -> tuple[Any, Any, Any]:
        from kubernetes import client

        api = self._client()
        return client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)

    def _networking(self) -> Any:
        from kubernetes import client

        return client.NetworkingV1Api(self._client())

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise LaunchError(
                f"the API server refused to {what} (HTTP {exc.status} {exc.reason}):\n{exc.body}\n"
                "check the namespace exists, the launcher's RBAC (deploy/kubernetes/rbac.yaml) and that "
                "Kueue's webhook runs"
            ) from None

    def check(self, plan: LaunchPlan) -> None:
        """Refuse a plan whose pods could not hand their files over (LaunchError), or whose LocalQueue does not
        exist in its namespace (SpecError)."""
        from kubernetes.client.exceptions import ApiException

        if self.config.pushes_run_files and not self.config.run_store_uri:
            # A pod's emptyDir home is its own: its result, events and Pipes messages would never reach Dagster.
            raise LaunchError(
                f"Kubernetes pods share no home with the Dagster side: set {RUN_STORE_ENV} (for example "
                "s3://<bucket>/runs, with the bucket's credentials the checkpoint store uses) so that pods hand "
                "their run's files over, or mount a ReadWriteMany home (KubernetesConfig.home_volume_claim)"
            )

        _, _, custom = self._apis()
        namespace, queue = plan.resources["namespace"], plan.resources["queue"]
        try:
            custom.get_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", queue)
        except ApiException as exc:
            if exc.status != 404:
                raise LaunchError(
                    f"could not read LocalQueue {namespace}/{queue}: HTTP {exc.status} {exc.body}"
                ) from None
            listed = custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues")
            known = ", ".join(q["metadata"]["name"] for q in listed.get("items", [])) or "(none)"
            raise SpecError(
                f"kubernetes.queue: LocalQueue {queue!r} does not exist in namespace {namespace!r} "
                f"(queues there: {known}); set kubernetes.queue or create it (deploy/kubernetes/kueue/)"
            ) from None

    def submit(self, plan: LaunchPlan) -> JobHandle:
        self.check(plan)
        core, batch, _ = self._apis()
        config_map, service, network_policy, job = yaml.safe_load_all(plan.files["manifests.yaml"])
        namespace = plan.resources["namespace"]
        created = self._call("create the Job", batch.create_namespaced_job, namespace, job)
        # The ConfigMap, Service and NetworkPolicy belong to the Job: deleting the Job deletes them too.
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": created.metadata.name,
            "uid": created.metadata.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
        for obj in (config_map, service, network_policy):
            obj["metadata"]["ownerReferences"] = [owner]
        self._call("create the spec ConfigMap", core.create_namespaced_config_map, namespace, config_map)
        self._call("create the rendezvous Service", core.create_namespaced_service, namespace, service)
        networking = self._networking()
        self._call("create the NetworkPolicy", networking.create_namespaced_network_policy, namespace, network_policy)
        return JobHandle(backend=self.name, job_id=f"{namespace}/{created.metadata.name}", run_id=plan.run_id)

    def status(self, handle: JobHandle) -> JobStatus:
        from kubernetes.client.exceptions import ApiException

        core, batch, custom = self._apis()
        namespace, name = handle.job_id.split("/", 1)
        api = self._client()
        try:
            job = api.sanitize_for_serialization(batch.read_namespaced_job(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return job_status(None, None, [])
            raise LaunchError(f"could not read Job {handle.job_id}: HTTP {exc.status} {exc.body}") from None
        uid = job["metadata"]["uid"]
        workloads = self._call(
            "list Workloads",
            custom.list_namespaced_custom_object,
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            "workloads",
            label_selector=f"kueue.x-k8s.io/job-uid={uid}",
        ).get("items", [])
        pods = self._call(
            "list Pods", core.list_namespaced_pod, namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
        )
        pod_dicts = [api.sanitize_for_serialization(p) for p in pods.items]
        return job_status(job, workloads[0] if workloads else None, pod_dicts)

    def cancel(self, handle: JobHandle) -> None:
        from kubernetes.client.exceptions import ApiException

        _, batch, _ = self._apis()
        namespace, name = handle.job_id.split("/", 1)
        try:
            # Foreground: the Job goes once its pods (and owned ConfigMap/Service) are gone.
            batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
        except ApiException as exc:
            if exc.status != 404:
                raise LaunchError(f"could not delete Job {handle.job_id}: HTTP {exc.status} {exc.body}") from None

    def publish_checkpoint(self, handle: JobHandle, checkpoint: DurableCheckpoint) -> None:
        """The Job's annotations name its last durable checkpoint, and its priority class is its `-checkpointed`
        twin while that checkpoint is fresh: among equals, Kueue then preempts it first (checkpoints/durable.py)."""
        _, batch, _ = self._apis()
        namespace, name = handle.job_id.split("/", 1)
        job = self._client().sanitize_for_serialization(self._call("read the Job", batch.read_namespaced_job, name,
                                                                   namespace))
        metadata: dict[str, Any] = {"annotations": checkpoint.job_annotations()}
        current = (job["metadata"].get("labels") or {}).get(PRIORITY_CLASS_LABEL)
        if current and (wanted := checkpoint.priority_class(current, time.time())) != current:
            metadata["labels"] = {PRIORITY_CLASS_LABEL: wanted}
        self._call("annotate the Job", batch.patch_namespaced_job, name, namespace, {"metadata": metadata})

    def move_to_on_demand(self, handle: JobHandle, spec: TrainSpec) -> str | None:
        """A Job Kueue evicted is suspended until readmitted: patch its pods onto on-demand nodes meanwhile.
        A running Job is left alone (None): it moves at its next eviction."""
        _, batch, _ = self._apis()
        namespace, name = handle.job_id.split("/", 1)
        job = self._call("read the Job", batch.read_namespaced_job, name, namespace)
        if not job.spec.suspend:
            return None
        self._call("patch the Job", batch.patch_namespaced_job, name, namespace, on_demand_patch(spec, self.config))
        return f"suspended Job {handle.job_id} moved to on-demand nodes"

    def release_requeue_hold(self, handle: JobHandle) -> str | None:
        """Kueue readmits an evicted Job by its own backoff and quota; the platform does not hurry it."""
        return None

    def wait(self, handle: JobHandle, timeout: float) -> None:
        time.sleep(timeout)  # one status read per poll: a watch per run would hold a connection to the API server

    def logs(self, handle: JobHandle) -> str:
        """Rank 0's pod log (pod index 0 runs the rendezvous head and global rank 0)."""
        core, _, _ = self._apis()
        namespace, name = handle.job_id.split("/", 1)
        selector = f"batch.kubernetes.io/job-name={name},batch.kubernetes.io/job-completion-index=0"
        pods = self._call("list Pods", core.list_namespaced_pod, namespace, label_selector=selector).items
        if not pods:
            return ""
        newest = max(pods, key=lambda p: p.metadata.creation_timestamp)
        return self._call("read the pod log", core.read_namespaced_pod_log, newest.metadata.name, namespace)
