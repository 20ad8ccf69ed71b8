"""Everything in deploy/kubernetes/ validates, and agrees with the launcher's defaults."""

from __future__ import annotations

import copy
import re
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from training_platform.checkpoints.durable import CHECKPOINTED_SUFFIX
from training_platform.launch.base import AGENT_MODULE, RunRequest
from training_platform.launch.k8s_manifests import KubernetesConfig
from training_platform.launch.kubernetes import KubernetesLauncher
from training_platform.policy.team_policy import SWEEP_QUEUE, resolve_team
from training_platform.policy.teams import Team, TeamsFile
from training_platform.shipped import INSTANCE_CONFIG
from training_platform.spec import parse_spec

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kubernetes"
# Helm values files are not API objects; they are checked on their own below.
HELM_VALUES = {DEPLOY / "dagster" / "values.yaml", DEPLOY / "kueue" / "kueue-values.yaml"}
CRDS = DEPLOY / "crds"  # the upstream CRDs we validate against, not manifests of ours
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p not in HELM_VALUES and CRDS not in p.parents)


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all() -> list[dict]:
    return [doc for path in MANIFESTS for doc in _docs(path)]


def _kind(kind: str) -> list[dict]:
    return [doc for doc in _all() if doc["kind"] == kind]


def _teams() -> dict[str, Team]:
    return TeamsFile.model_validate(yaml.safe_load((DEPLOY.parent / "teams.yaml").read_text())).teams


def test_manifests_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {
        "rbac.yaml",
        "admission.yaml",
        "network-policy.yaml",
        "kueue/resource-flavors.yaml",
        "kueue/cluster-queues.yaml",
        "kueue/local-queues.yaml",
        "kueue/priority-classes.yaml",
        "kueue/topology.yaml",
        "mlflow.yaml",
    } <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_manifest_validates(path, validate_k8s):
    for doc in _docs(path):
        validate_k8s(doc)


def test_a_misspelled_field_or_an_unknown_kind_of_kueue_is_refused(validate_k8s):
    queue = _kind("ClusterQueue")[0]
    misspelled = copy.deepcopy(queue)
    misspelled["spec"]["namespaceSelectr"] = {}
    with pytest.raises(jsonschema.ValidationError, match="namespaceSelectr"):
        validate_k8s(misspelled)
    with pytest.raises(AssertionError, match="no CRD for ClusterQueues.kueue.x-k8s.io"):
        validate_k8s({**queue, "kind": "ClusterQueues"})


def test_flavors_on_demand_and_spot_per_gpu_type():
    flavors = {f["metadata"]["name"]: f["spec"] for f in _kind("ResourceFlavor")}
    gpu_types = {name.removesuffix("-spot").removesuffix("-on-demand") for name in flavors if name != "cpu"}
    assert len(gpu_types) >= 2
    for gpu in gpu_types:
        assert {f"{gpu}-spot", f"{gpu}-on-demand"} <= set(flavors)
        assert flavors[f"{gpu}-spot"]["nodeTaints"][0]["key"] == KubernetesConfig().spot_taint_key
        assert "nodeTaints" not in flavors[f"{gpu}-on-demand"]
    products = set(KubernetesConfig().gpu_products.values())
    assert {f["nodeLabels"]["nvidia.com/gpu.product"] for n, f in flavors.items() if n != "cpu"} <= products


def test_team_queues_share_one_cohort_with_borrowing_and_fair_sharing():
    flavors = {f["metadata"]["name"] for f in _kind("ResourceFlavor")}
    queues = _kind("ClusterQueue")
    assert len(queues) >= 2
    assert {q["spec"]["cohortName"] for q in queues} == {"training"}
    assert [c["metadata"]["name"] for c in _kind("Cohort")] == ["training"]
    for queue in queues:
        spec = queue["spec"]
        assert spec["fairSharing"]["weight"] >= 1
        assert spec["preemption"]["reclaimWithinCohort"] != "Never"
        for group in spec["resourceGroups"]:
            for flavor in group["flavors"]:
                assert flavor["name"] in flavors
                assert {r["name"] for r in flavor["resources"]} == set(group["coveredResources"])
                assert any("borrowingLimit" in r for r in flavor["resources"])
    kueue_config = yaml.safe_load(
        yaml.safe_load((DEPLOY / "kueue" / "kueue-values.yaml").read_text())["managerConfig"][
            "controllerManagerConfigYaml"
        ]
    )
    assert kueue_config["kind"] == "Configuration" and kueue_config["fairSharing"]["enable"] is True
    assert kueue_config["admissionFairSharing"]["usageHalfLifeTime"]


def test_launcher_defaults_name_objects_that_exist():
    config = KubernetesConfig()
    cluster_queues = {q["metadata"]["name"] for q in _kind("ClusterQueue")}
    local_queues = {(q["metadata"]["namespace"], q["metadata"]["name"]) for q in _kind("LocalQueue")}
    for namespace, name in local_queues:
        assert name in (config.queue_template.format(team=namespace), SWEEP_QUEUE.format(team=namespace))
    assert {q["spec"]["clusterQueue"] for q in _kind("LocalQueue")} <= cluster_queues
    classes = {p["metadata"]["name"]: p["value"] for p in _kind("WorkloadPriorityClass")}
    own = set(config.priority_classes.values())
    assert set(classes) == own | {name + CHECKPOINTED_SUFFIX for name in own}
    # A class's checkpointed twin is just below it, and still above every lower class: it only breaks ties.
    for name in own:
        assert classes[name + CHECKPOINTED_SUFFIX] == classes[name] - 1
        lower = [classes[other] for other in own if classes[other] < classes[name]]
        assert all(classes[name + CHECKPOINTED_SUFFIX] > value for value in lower)
    (topology,) = _kind("Topology")
    levels = [level["nodeLabel"] for level in topology["spec"]["levels"]]
    assert set(config.topology_levels.values()) <= set(levels)


_API_CALL = re.compile(r"\b(batch|core|networking)\.(create|read|list|patch|delete)_namespaced_(\w+)")
_CUSTOM_CALL = re.compile(
    r"custom\.(get|list)_namespaced_custom_object" r'\W+KUEUE_GROUP\W+KUEUE_VERSION\W+\w+\W+"(\w+)"'
)
_GROUPS = {"batch": "batch", "core": "", "networking": "networking.k8s.io"}
_RESOURCES = {"job": "jobs", "config_map": "configmaps", "service": "services", "network_policy": "networkpolicies",
              "pod": "pods", "pod_log": "pods/log"}


def _launcher_api_calls() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every call the Kubernetes launcher makes, read from its source."""
    source = (ROOT / "training_platform" / "launch" / "kubernetes.py").read_text()
    calls = {
        (_GROUPS[api], _RESOURCES[kind], "get" if verb == "read" else verb)
        for api, verb, kind in _API_CALL.findall(source)
    }
    calls |= {("kueue.x-k8s.io", plural, verb) for verb, plural in _CUSTOM_CALL.findall(source)}
    return calls


def test_launcher_rbac_is_least_privilege():
    (role,) = _kind("ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = _launcher_api_calls()
    # The moves of a suspended Job to on-demand nodes and its checkpoint annotations patch it: once missing here.
    assert ("batch", "jobs", "patch") in needed and ("kueue.x-k8s.io", "workloads", "list") in needed
    assert needed <= granted
    forbidden = {"secrets", "pods/exec", "serviceaccounts", "serviceaccounts/token", "namespaces", "*"}
    assert not {g for g in granted if g[1] in forbidden or g[2] in ("*", "escalate", "bind", "impersonate")}
    assert not {g for g in granted if g[1] == "pods" and g[2] not in ("get", "list", "watch")}
    # Bound in the namespaces of the declared teams, and nowhere else.
    bound = {b["metadata"]["namespace"] for b in _kind("RoleBinding")}
    assert bound == {team.kubernetes.namespace for team in _teams().values()}
    assert bound == {q["metadata"]["namespace"] for q in _kind("LocalQueue")}
    assert not _kind("ClusterRoleBinding")


def test_dagster_helm_values_use_k8s_run_launcher_and_postgres():
    values = yaml.safe_load((DEPLOY / "dagster" / "values.yaml").read_text())
    # Top-level keys of the official chart (helm/dagster/values.yaml, Dagster 1.x).
    known = {
        "global",
        "dagsterWebserver",
        "dagster-user-deployments",
        "runLauncher",
        "dagsterDaemon",
        "postgresql",
        "generatePostgresqlPasswordSecret",
        "serviceAccount",
        "rbacEnabled",
        "computeLogManager",
        "pythonLogs",
        "ingress",
        "telemetry",
    }
    assert set(values) <= known
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is True and "postgresqlPassword" not in values["postgresql"]
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert launcher["runK8sConfig"]["podSpecConfig"]["serviceAccountName"] == "training-launcher"


def test_dagster_helm_values_queue_runs_as_the_shipped_instance_does():
    """The cluster's queue is the platform's: our coordinator class, limits on the same tags (with more room)."""
    values = yaml.safe_load((DEPLOY / "dagster" / "values.yaml").read_text())
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["type"] == "CustomRunCoordinator"
    custom = coordinator["config"]["customRunCoordinator"]
    shipped = yaml.safe_load(INSTANCE_CONFIG.read_text())["run_coordinator"]
    assert (custom["module"], custom["class"]) == (shipped["module"], shipped["class"])
    keys = [limit["key"] for limit in custom["config"]["tag_concurrency_limits"]]
    assert keys == [limit["key"] for limit in shipped["config"]["tag_concurrency_limits"]]
    # The webserver submits runs through the coordinator and the daemon dequeues them: both load our class.
    image = values["dagster-user-deployments"]["deployments"][0]["image"]
    assert values["dagsterWebserver"]["image"] == values["dagsterDaemon"]["image"] == image
    # The coordinator reads the spec of a run launched by partition alone from the run registry: both reach it.
    for part in ("dagsterWebserver", "dagsterDaemon"):
        assert {"name": "training-platform-database"} in values[part]["envSecrets"], part


def test_every_setting_the_helm_values_pass_is_one_the_platform_reads():
    values = yaml.safe_load((DEPLOY / "dagster" / "values.yaml").read_text())
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    names = {entry["name"] for entry in deployment["env"]}
    sources = "".join(
        path.read_text() for package in ("training_platform", "resources", "sensors", "assets")
        for path in (ROOT / package).rglob("*.py")
    )
    unread = sorted(name for name in names if f'"{name}"' not in sources)
    assert not unread, f"deploy/kubernetes/dagster/values.yaml sets {unread}, which no code reads"
    mlflow = next(d for d in _docs(DEPLOY / "mlflow.yaml") if d["kind"] == "Service")
    tracking = next(e["value"] for e in deployment["env"] if e["name"] == "MLFLOW_TRACKING_URI")
    service = f"http://{mlflow['metadata']['name']}.{mlflow['metadata']['namespace']}.svc.cluster.local"
    assert tracking == f"{service}:{mlflow['spec']['ports'][0]['port']}"  # the server mlflow.yaml deploys


def test_the_code_location_image_installs_every_package_of_the_code_location():
    dockerfile = (DEPLOY / "image" / "code-location.Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in project["packages"]["find"]["include"]} | {"training_platform_dagster"}
    modules = {f"{m}.py" for m in project["py-modules"]}
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert packages | modules <= copied, f"the code-location image lacks {sorted(packages | modules - copied)}"
    assert "pip install -c constraints.txt ." in dockerfile


def test_training_image_pins_the_projects_torch_and_runs_as_non_root():
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    pyproject = (DEPLOY.parents[1] / "pyproject.toml").read_text()
    torch_pin = re.search(r'"torch==([^"]+)"', pyproject).group(1)
    assert f"ARG TORCH_VERSION={torch_pin}" in dockerfile
    assert re.search(r"^USER 1000$", dockerfile, re.MULTILINE)
    assert "dagster-pipes" in dockerfile and "pip install dagster " not in dockerfile


# What a training pod may import: the worker, its agent and writer, every strategy, template and adapter (loaded by
# name), and every platform module those import, at module level or inside a function (sweep pruning, plots, NVML
# on GPU nodes are all function-level imports that pods run).
POD_ROOTS = ("training_platform.train", AGENT_MODULE, "training_platform.checkpoints.writer_process")
# Imported by platform modules a pod reaches, but never run there.
NOT_IN_PODS = {"great-expectations": "snapshots are validated by the Dagster asset check, never in a training pod"}
# Named by a URL, not an import: Optuna's storage on PostgreSQL (TP_SWEEP_STORAGE) loads it through SQLAlchemy.
BY_URL = {"psycopg2-binary"}


def _module_file(name: str) -> Path:
    path = ROOT / Path(*name.split("."))
    return path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")


def _pod_imports() -> dict[str, set[str]]:
    """Third-party top-level module -> the platform modules that import it, over the pods' import closure."""
    import ast

    todo = [*POD_ROOTS, *(f"training_platform.train.{p.parent.name}.{p.stem}" for p in (ROOT / "training_platform"
            / "train").glob("*/*.py") if p.stem != "__init__")]
    seen: set[str] = set()
    third: dict[str, set[str]] = {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # parents' __init__ run first
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top == "training_platform":
                    todo.append(module)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third.setdefault(top, set()).add(name)
    return third


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_dependencies(dists: set[str]) -> set[str]:
    """DISTS and everything they require (as installed here, where constraints.txt pins the same versions)."""
    from importlib import metadata

    found, todo = set(), list(dists)
    while todo:
        dist = _normalized(todo.pop())
        if dist in found:
            continue
        found.add(dist)
        try:
            requirements = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requirements if "extra ==" not in r]
    return found


def test_training_image_installs_every_package_a_pod_imports_for_every_strategy_and_adapter():
    from importlib.metadata import packages_distributions

    imports = _pod_imports()
    assert {"torch", "pydantic", "deepspeed", "transformers", "lightning", "optuna"} <= set(imports), sorted(imports)
    dists = packages_distributions()
    # A module several distributions ship (mlflow: mlflow, mlflow-skinny, mlflow-tracing) needs one of them.
    needed = [{_normalized(d) for d in dists.get(module, [module])} for module in imports] + [{d} for d in BY_URL]
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    listed = {_normalized(n) for n in re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?[=<>~!]', dockerfile)}
    installed = _with_dependencies(listed) | set(NOT_IN_PODS)
    missing = sorted("/".join(sorted(options)) for options in needed if not options & installed)
    assert not missing, f"deploy/kubernetes/image/Dockerfile does not install {missing}, which training pods import"
    # The adapters' and strategies' own extras, whole (accelerate is imported by transformers' Trainer, not by us).
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("hf", "lightning", "deepspeed"):
        for requirement in extras[extra]:
            assert _normalized(re.split(r"[<>=!~\[]", requirement)[0]) in listed, (extra, requirement)


def test_team_namespaces_carry_what_the_teams_file_declares():
    namespaces = {n["metadata"]["name"]: n["metadata"] for n in _kind("Namespace")}
    accounts = {(a["metadata"]["namespace"], a["metadata"]["name"]): a for a in _kind("ServiceAccount")}
    deny_all = {p["metadata"]["namespace"] for p in _kind("NetworkPolicy") if "ingress" not in p["spec"]}
    for name, team in _teams().items():
        k8s = team.kubernetes
        meta = namespaces[k8s.namespace]
        assert meta["labels"]["training-platform.io/team"] == name
        annotations = meta["annotations"]
        assert annotations["training-platform.io/queue"] == k8s.queue
        assert annotations["training-platform.io/sweep-queue"] == k8s.sweep_queue
        assert annotations["training-platform.io/service-account"] == k8s.service_account
        allowed = {key.split("/", 1)[1] for key in annotations if key.startswith("secrets.training-platform.io/")}
        assert allowed == set(k8s.secrets)
        assert accounts[(k8s.namespace, k8s.service_account)]["automountServiceAccountToken"] is False
        assert k8s.namespace in deny_all  # training pods accept nothing but their own Job's pods


# ---- the admission policies, evaluated (cel-python) on what the launcher renders ----------------------------
LAUNCHER = "system:serviceaccount:dagster:training-launcher"


def _policy(name: str) -> dict:
    (policy,) = [p for p in _kind("ValidatingAdmissionPolicy") if p["metadata"]["name"] == name]
    assert {b["spec"]["policyName"] for b in _kind("ValidatingAdmissionPolicyBinding")} >= {name}
    return policy["spec"]


def _admits(policy: dict, obj: dict, namespace: dict, user: str = LAUNCHER) -> list[str]:
    """The messages of the validations that `obj` fails (empty: admitted), as the API server evaluates them."""
    import celpy

    env = celpy.Environment()

    def run(expression: str, activation: dict):
        return env.program(env.compile(expression)).evaluate(activation)

    request = {"userInfo": {"username": user}, "kind": {"kind": obj["kind"]}}
    activation = {"object": obj, "namespaceObject": namespace, "request": request}
    activation = {key: celpy.json_to_cel(value) for key, value in activation.items()}
    if not all(run(c["expression"], activation) for c in policy.get("matchConditions", [])):
        return []
    variables = {}
    for variable in policy.get("variables", []):
        variables[variable["name"]] = run(variable["expression"], {**activation, "variables": variables})
    activation["variables"] = celpy.celtypes.MapType(variables)
    return [v["message"] for v in policy["validations"] if not run(v["expression"], activation)]


def _rendered(team: str, tmp_path: Path, sweep_trial: bool = False, **fields) -> tuple[dict[str, dict], dict]:
    teams = tmp_path / "teams.yaml"
    teams.write_text((DEPLOY.parent / "teams.yaml").read_text())
    spec = parse_spec({"name": "resnet", "team": team, "owner": "ada", "backend": "k8s", **fields})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TP_TEAMS", str(teams))
        spec = resolve_team(spec, tmp_path, sweep_trial=sweep_trial)
    plan = KubernetesLauncher().plan(RunRequest(spec=spec, run_id="resnet-1", run_dir=tmp_path / "run"))
    objects = {o["kind"]: o for o in yaml.safe_load_all(plan.files["manifests.yaml"])}
    (namespace,) = [n for n in _kind("Namespace") if n["metadata"]["name"] == objects["Job"]["metadata"]["namespace"]]
    return objects, namespace


@pytest.mark.parametrize("sweep_trial", [False, True], ids=["run", "sweep-trial"])
@pytest.mark.parametrize("team", ["vision", "nlp", "research"])
def test_admission_lets_the_launcher_create_what_it_renders_for_each_team(team, sweep_trial, tmp_path):
    objects, namespace = _rendered(team, tmp_path, sweep_trial, kubernetes={"secret_refs": [f"{team}-s3-credentials"]})
    queue = objects["Job"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert queue == (f"{team}-sweeps" if sweep_trial else f"{team}-queue")
    assert _admits(_policy("training-launcher-jobs"), objects["Job"], namespace) == []
    for kind in ("Service", "NetworkPolicy"):
        assert _admits(_policy("training-launcher-network"), objects[kind], namespace) == []


def _edit(obj: dict, path: str, value) -> dict:
    obj = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = obj
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[last] = value
    return obj


POD = "spec.template.spec"


@pytest.mark.parametrize(
    ("path", "value", "refusal"),
    [
        # What the reported cross-team spec asked for, now written straight into a vision Job.
        (f"{POD}.containers.0.envFrom", [{"secretRef": {"name": "nlp-s3-credentials"}}], "only the Secrets"),
        (f"{POD}.serviceAccountName", "nlp-trainer", "its namespace's service account"),
        ("metadata.labels", {"kueue.x-k8s.io/queue-name": "nlp-queue"}, "its namespace's LocalQueue"),
        ("metadata.labels", {"kueue.x-k8s.io/queue-name": "nlp-sweeps"}, "its namespace's LocalQueue"),
        (f"{POD}.automountServiceAccountToken", True, "no service account token"),
        (f"{POD}.volumes", [{"name": "s", "secret": {"secretName": "vision-s3-credentials"}}], "no Secret"),
        (
            f"{POD}.containers.0.env",
            [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "nlp-s3-credentials", "key": "k"}}}],
            "only the Secrets",
        ),
    ],
)
def test_admission_refuses_a_launcher_job_beyond_its_namespaces_allowances(tmp_path, path, value, refusal):
    objects, namespace = _rendered("vision", tmp_path)
    refused = _admits(_policy("training-launcher-jobs"), _edit(objects["Job"], path, value), namespace)
    assert any(refusal in message for message in refused), refused
    # Anyone else's Jobs are none of these policies' business (Kubernetes RBAC governs them).
    assert _admits(_policy("training-launcher-jobs"), _edit(objects["Job"], path, value), namespace, "alice") == []


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Service", "spec.type", "NodePort"),
        ("Service", "spec.clusterIP", "10.0.0.7"),
        ("NetworkPolicy", "spec.ingress", [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]),
        ("NetworkPolicy", "spec.ingress", [{"from": [{"namespaceSelector": {}}]}]),
        ("NetworkPolicy", "spec.ingress", [{"ports": [{"port": 29500}]}]),  # from anywhere
    ],
)
def test_admission_refuses_launcher_objects_that_open_the_rendezvous_port(tmp_path, kind, path, value):
    objects, namespace = _rendered("vision", tmp_path)
    assert _admits(_policy("training-launcher-network"), _edit(objects[kind], path, value), namespace)


def test_the_dagster_side_shares_one_read_write_many_home():
    """The code server (the sensors) and every run's pod read and write the same run directories."""
    values = yaml.safe_load((DEPLOY / "dagster" / "values.yaml").read_text())
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True  # run pods get its volumes and env
    home = next(e["value"] for e in deployment["env"] if e["name"] == "TP_HOME")
    (mount,) = [m for m in deployment["volumeMounts"] if m["mountPath"] == home]
    (volume,) = [v for v in deployment["volumes"] if v["name"] == mount["name"]]
    claimed = volume["persistentVolumeClaim"]["claimName"]
    (claim,) = [c for c in _kind("PersistentVolumeClaim") if c["metadata"]["name"] == claimed]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["namespace"] == values["runLauncher"]["config"]["k8sRunLauncher"]["jobNamespace"]
    # The image runs as uid 1000: both the code server's pod and the run pods may write the volume.
    assert deployment["podSecurityContext"]["fsGroup"] == 1000
    run_pods = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["podSpecConfig"]
    assert run_pods["securityContext"]["fsGroup"] == 1000


def test_a_run_whose_pod_died_is_marked_failed_so_that_its_job_is_taken_over():
    values = yaml.safe_load((DEPLOY / "dagster" / "values.yaml").read_text())
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert monitoring["enabled"] is True and monitoring["maxResumeRunAttempts"] == 0


def test_each_team_admits_from_its_runs_and_sweeps_queues_by_recent_usage():
    """Admission fair sharing: within a team's ClusterQueue, the LocalQueue that used least lately goes first."""
    cluster_queues = {q["metadata"]["name"]: q["spec"] for q in _kind("ClusterQueue")}
    for team in _teams().values():
        k8s = team.kubernetes
        queues = {
            q["metadata"]["name"]: q["spec"]["clusterQueue"]
            for q in _kind("LocalQueue")
            if q["metadata"]["namespace"] == k8s.namespace
        }
        assert set(queues) == {k8s.queue, k8s.sweep_queue} and len(set(queues.values())) == 1
        scope = cluster_queues[queues[k8s.queue]]["admissionScope"]
        assert scope["admissionMode"] == "UsageBasedAdmissionFairSharing"
