"""MLflow conventions: required tags on every run, lineage fields, the model registry and its gate."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from training_platform.redaction import Redactor
from training_platform.runs.lineage import LineageKey
from training_platform.spec import GateSpec, TrainSpec
from training_platform.train.model_requirements import model_requirements

CHAMPION_ALIAS = "champion"
ALIAS_WRITE_ATTEMPTS = 5
REQUIRED_TAGS = (
    "team",
    "owner",
    "task",
    "candidate_status",
    "spec_hash",
    "snapshot_id",
    "git_commit",
    "environment_lock_hash",
    "seed",
    "dagster_run_id",
)


_INITIALIZED: set[str] = set()
# mlflow.pytorch imports its Lightning autologging callback as it loads, whenever Lightning is installed (the
# platform's `lightning` extra): pytorch_lightning, torchmetrics and transformers, 3.2 s of a core in each process
# that registers a model, for a callback the platform never uses. `mlflow.pytorch.autolog()` still imports it.
_LIGHTNING_AUTOLOG = "mlflow.pytorch._lightning_autolog"


def mlflow_pytorch() -> ModuleType:
    """mlflow.pytorch for the platform's own processes, loaded without its Lightning callback (above); not for a
    process that runs a user's code, which may use that callback."""
    if "mlflow.pytorch" not in sys.modules and _LIGHTNING_AUTOLOG not in sys.modules:
        sys.modules[_LIGHTNING_AUTOLOG] = None  # type: ignore[assignment]  # its import fails; mlflow.pytorch goes on
        try:
            import mlflow.pytorch
        finally:
            del sys.modules[_LIGHTNING_AUTOLOG]
    import mlflow.pytorch

    return mlflow.pytorch


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    _initialize_once(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


def _initialize_once(tracking_uri: str) -> None:
    """MLflow creates and migrates a SQLite store on first use, and processes doing it at once collide
    (`table _alembic_tmp_experiments already exists`: several runs starting on a new home). The first
    process does it under a file lock beside the database; the others find it done."""
    if tracking_uri in _INITIALIZED or not tracking_uri.startswith("sqlite:///"):
        return
    from mlflow.tracking import MlflowClient

    database = Path(tracking_uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with database.with_name(f"{database.name}.init-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
    _INITIALIZED.add(tracking_uri)


def experiment_name(spec: TrainSpec) -> str:
    return f"{spec.team}/{spec.name}"


def ensure_experiment(tracking_uri: str, name: str, artifact_root: Path) -> str:
    client = _client(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    from mlflow.exceptions import MlflowException

    # A local store: an explicit artifact location keeps artifacts in the project data directory, not ./mlruns.
    # A tracking server: its own artifact destination (a team's bucket), which every machine reaches through it.
    remote = tracking_uri.startswith(("http://", "https://"))
    location = None if remote else (artifact_root / name.replace("/", "_")).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id  # a run starting beside this one created it


def run_tags(spec: TrainSpec, lineage: LineageKey, dagster_run_id: str, run_id: str) -> dict[str, str]:
    return {
        "team": spec.team,
        "owner": spec.owner,
        "task": spec.task,
        "candidate_status": "training",
        "spec_hash": lineage.spec_hash,
        "snapshot_id": lineage.snapshot_id,
        "git_commit": lineage.code_commit,
        "git_dirty": str(lineage.code_dirty).lower(),
        "environment_lock_hash": lineage.environment_lock_hash,
        "seed": str(lineage.seed),
        "dagster_run_id": dagster_run_id,
        "training_run": run_id,
        "backend": lineage.backend,
        "mlflow.runName": run_id,
    } | ({"script_sha256": lineage.script_sha256} if lineage.script_sha256 else {})


def spec_params(spec: TrainSpec) -> dict[str, str]:
    """The spec, flattened to MLflow params, with anything secret masked by content (redaction.py):
    arguments, URLs and the values of this process's secret variables."""
    flat: dict[str, str] = {}
    redactor = Redactor()

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        elif isinstance(node, list):
            flat[prefix] = str(redactor.args(str(item) for item in node))
        else:
            flat[prefix] = redactor.text(str(node))

    # A user's script is its hash here (entrypoint.code.sha256): its text would pass MLflow's limit on a value.
    walk("", spec.model_dump(mode="json", exclude={"entrypoint": {"code": {"text"}}}))
    return flat


def start_run(tracking_uri: str, artifact_root: Path, spec: TrainSpec, tags: dict[str, str]) -> str:
    from mlflow.entities import Param

    client = _client(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, experiment_name(spec), artifact_root)
    run = client.create_run(experiment_id, tags=tags, run_name=tags.get("training_run"))
    params = [Param(k, v) for k, v in spec_params(spec).items()]
    client.log_batch(run.info.run_id, params=params)
    return run.info.run_id


def end_run(tracking_uri: str, mlflow_run_id: str, succeeded: bool) -> None:
    _client(tracking_uri).set_terminated(mlflow_run_id, status="FINISHED" if succeeded else "FAILED")


def set_tags(tracking_uri: str, mlflow_run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    # One request for all of them: on a tracking server each write is a round trip and a transaction.
    _client(tracking_uri).log_batch(mlflow_run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])


def log_metrics(tracking_uri: str, mlflow_run_id: str, metrics: dict[str, float]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    points = [Metric(key, float(value), now, 0) for key, value in metrics.items()]
    _client(tracking_uri).log_batch(mlflow_run_id, metrics=points)


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str
    champion_version: str | None
    champion_value: float | None


Remeasure = Callable[[Mapping[str, str]], dict[str, float]]
"""The metrics of the version with these tags, measured on the candidate's test split (champion.py)."""


def metric_tag(metric: str) -> str:
    """The registry tag that holds a version's test metric (`test_accuracy`, as versions always had)."""
    return f"test_{metric}"


def promotion_gate(
    tracking_uri: str,
    model_name: str,
    candidate: dict[str, float],
    gate: GateSpec,
    split: str | None = None,
    remeasure: Remeasure | None = None,
) -> GateDecision:
    """Promote when there is no champion yet, or the candidate beats it on the gate's metric by at least
    `min_improvement` (strictly, when that is 0). SPLIT: the snapshot whose test split measured the candidate;
    a champion measured on another is measured again on it (REMEASURE) before they are compared."""
    from mlflow.exceptions import MlflowException

    from training_platform.registry.champion import ChampionNotMeasured, measured_on

    client = _client(tracking_uri)
    try:
        champion = client.get_model_version_by_alias(model_name, CHAMPION_ALIAS)
    except MlflowException:
        return GateDecision(True, "no champion yet", None, None)
    name, value = gate.metric, candidate[gate.metric]
    recorded, where = champion.tags.get(metric_tag(name)), ""
    champion_split = measured_on(champion.tags)
    if split is not None:
        where = f", both on the test split of snapshot {split[:12]}"
    if split is not None and champion_split != split and remeasure is not None:
        try:
            recorded = str(remeasure(champion.tags)[name])
            where += f" (champion v{champion.version} measured again on it)"
        except (ChampionNotMeasured, KeyError) as exc:
            missing = f"its evaluation does not report {name}" if isinstance(exc, KeyError) else str(exc)
            where = (
                f"; the champion as recorded on snapshot {str(champion_split)[:12]}'s test split, the candidate on "
                f"{split[:12]}'s: the champion could not be measured again ({missing})"
            )
    if recorded is None:
        return GateDecision(
            False,
            f"champion v{champion.version} has no test {name} to compare with; keep it, or move the alias "
            "by hand after evaluating it",
            champion.version,
            None,
        )
    champion_value = float(recorded)
    gain = value - champion_value if gate.direction == "maximize" else champion_value - value
    beats = gain >= gate.min_improvement if gate.min_improvement > 0 else gain > 0
    margin = f" by at least {gate.min_improvement:g}" if gate.min_improvement > 0 else ""
    verb = "beats" if beats else "does not beat"
    return GateDecision(
        beats,
        f"test {name} {value:.4f} {verb} champion v{champion.version} ({champion_value:.4f}){margin}{where}",
        champion.version,
        champion_value,
    )


def register_model(
    tracking_uri: str, mlflow_run_id: str, model_name: str, model: Any, input_example: Any, tags: dict[str, str]
) -> str:
    """Log the model into its training run and register a version with lineage tags; the alias moves through
    `promote`."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=mlflow_run_id):
        info = mlflow_pytorch().log_model(
            model, name="model", input_example=input_example, pip_requirements=model_requirements()
        )
    return register_logged_model(tracking_uri, info.model_uri, model_name, tags)


def register_logged_model(tracking_uri: str, model_uri: str, model_name: str, tags: dict[str, str]) -> str:
    """Register a model already logged (a script's, by its evaluation process) as a version with lineage tags."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return str(mlflow.register_model(model_uri, model_name, tags=tags).version)


def promote(
    tracking_uri: str,
    mlflow_run_id: str,
    model_name: str,
    version: str,
    candidate: dict[str, float],
    gate_spec: GateSpec,
    lock: contextlib.AbstractContextManager[None],
    split: str | None = None,
    remeasure: Remeasure | None = None,
) -> GateDecision:
    """The gate, then the champion alias moved to VERSION if it passed, as one step per model.

    Two runs of one model that finish together (a sweep, a team's batch) would otherwise both pass against the
    same champion, and the worse could end champion, or the second alias write fail outright (SQLite's store
    inserts the alias, and the two inserts collide). The step holds LOCK, the model's (documents.shared_lock:
    every process of the deployment respects it), and retries a write that collided, deciding again each time.
    """
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    with lock:
        for attempt in range(ALIAS_WRITE_ATTEMPTS):
            gate = promotion_gate(tracking_uri, model_name, candidate, gate_spec, split, remeasure)
            if gate.champion_version is not None and str(gate.champion_version) == version:
                # The write that raised had gone through: this version is the champion already.
                gate = GateDecision(True, f"v{version} is the champion", gate.champion_version, gate.champion_value)
                break
            if not gate.promote:
                break
            try:
                client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
                break
            except MlflowException:
                if attempt == ALIAS_WRITE_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * 2**attempt)
    client.set_tag(mlflow_run_id, "candidate_status", "champion" if gate.promote else "rejected")
    client.set_model_version_tag(model_name, version, "gate", gate.reason)  # why, beside the version
    return gate
