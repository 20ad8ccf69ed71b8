"""Typed, validated training specs: the contract between users and every backend.

A spec is validated once, at the edge (``load_spec``). Errors are collected into one
``SpecError`` whose lines each name the field, the problem and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from training_platform.errors import SpecError
from training_platform.identifiers import K8S_NAME, SLURM_NAME
from training_platform.spec.file_source import FileColumns, FileExpectations, FileSplit, check_file_uri, is_file_uri

MODEL_TEMPLATES = ("digits_mlp", "gpt")  # the built-in models; train/templates has the module of each
GPU_TYPES = ("T4", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100", "H200")
DATASET_SOURCES = ("sklearn_digits", "python_stdlib_text", "digits_daily")  # digits_daily: daily drops
STRATEGIES = ("ddp", "fsdp", "deepspeed")
BACKENDS = ("local", "slurm", "k8s")

_SLUG = r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$"
_STEPS = TypeAdapter(Annotated[int, Field(ge=1)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    template: str = Field("digits_mlp", description=f"model template, one of {', '.join(MODEL_TEMPLATES)}")
    size: Literal["tiny", "small", "base"] = Field("small", description="template size: tiny, small or base")
    seq_len: int = Field(64, ge=8, le=8192, description="tokens per sequence for language models (8..8192)")
    layers: int | None = Field(None, ge=1, le=256, description="transformer blocks; default: from size")
    heads: int | None = Field(None, ge=1, le=256, description="attention heads; default: from size")
    width: int | None = Field(None, ge=8, le=65536, description="embedding width; default: from size")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSpec:
        if self.width is not None and self.heads is not None and self.width % self.heads:
            raise ValueError(f"model.width ({self.width}) must be a multiple of model.heads ({self.heads})")
        return self

    @field_validator("template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        if value not in MODEL_TEMPLATES:
            raise ValueError(f"unknown template {value!r}; use one of: {', '.join(MODEL_TEMPLATES)}")
        return value


class DatasetSpec(_Strict):
    source: str | None = Field(
        "sklearn_digits",
        description=f"data to snapshot: one of {', '.join(DATASET_SOURCES)}, or your own files: a path, a "
        "directory, a glob or s3://bucket/prefix of Parquet, CSV or JSON Lines files (a relative path is read "
        "from the spec file's directory)",
    )
    snapshot_id: str | None = Field(
        None, description="an existing snapshot id (64 hex characters); overrides building from source"
    )
    as_of: date | None = Field(
        None, description="train on the dataset_snapshot of this day (YYYY-MM-DD); default: the newest day built"
    )
    columns: FileColumns | None = Field(None, description="your files' columns by role: label, features, text, image")
    split: FileSplit | None = Field(
        None, description="how your files' rows split: an existing column, or fractions by a key's hash (70/15/15)"
    )
    expectations: FileExpectations | None = Field(
        None, description="what your files' columns must hold (types, not null, ranges, values, unique, row count)"
    )

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str | None) -> str | None:
        if value is not None and value not in DATASET_SOURCES:
            if not is_file_uri(value):
                raise ValueError(
                    f"unknown source {value!r}; use one of: {', '.join(DATASET_SOURCES)}, or your own files: a "
                    f"path such as ./{value}, a glob or an s3:// URI"
                )
            return check_file_uri(value)
        return value

    @field_validator("snapshot_id")
    @classmethod
    def _hex_id(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError("snapshot_id must be 64 lowercase hex characters (see `tp snapshots` or the UI)")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> DatasetSpec:
        if self.source is None and self.snapshot_id is None:
            raise ValueError("set either dataset.source or dataset.snapshot_id")
        if self.is_file_source and self.columns is None:
            raise ValueError(
                f"dataset.source {self.source} is your own files: name their label column in dataset.columns.label"
            )
        if not self.is_file_source and any(
            part is not None for part in (self.columns, self.split, self.expectations)
        ):
            raise ValueError(
                "dataset.columns, dataset.split and dataset.expectations describe your own files; set "
                "dataset.source to their path or s3:// URI, or leave them out"
            )
        return self

    @property
    def is_file_source(self) -> bool:
        return self.source is not None and self.source not in DATASET_SOURCES


class TrainingSpec(_Strict):
    max_steps: int = Field(200, ge=1, description="optimizer steps to train for (>= 1)")
    batch_size: int = Field(32, ge=1, le=65536, description="per-process batch size (>= 1)")
    learning_rate: float = Field(1e-3, gt=0, le=10, description="optimizer learning rate (> 0)")
    optimizer: Literal["adam", "adamw", "sgd"] = Field("adam", description="adam, adamw or sgd")
    weight_decay: float = Field(0.0, ge=0, description="weight decay (>= 0)")
    seed: int = Field(0, ge=0, description="random seed (>= 0); same seed, same weights on CPU")
    eval_every: int = Field(50, ge=1, description="steps between validation passes (>= 1)")
    log_every: int = Field(10, ge=1, description="steps between metric reports (>= 1)")


class ResourceRequest(_Strict):
    nodes: int = Field(1, ge=1, le=4096, description="number of nodes (>= 1)")
    procs_per_node: int = Field(2, ge=1, le=64, description="processes per node (>= 1)")
    gpus_per_node: int = Field(0, ge=0, le=16, description="GPUs per node (0 for CPU)")
    gpu_type: str | None = Field(None, description=f"GPU type, one of {', '.join(GPU_TYPES)}")
    spot: bool = Field(False, description="allow spot / preemptible capacity")
    priority: Literal["low", "normal", "high"] = Field("normal", description="low, normal or high")

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None and value not in GPU_TYPES:
            raise ValueError(f"unknown GPU type {value!r}; use one of: {', '.join(GPU_TYPES)}")
        return value

    @model_validator(mode="after")
    def _gpu_consistency(self) -> ResourceRequest:
        if self.gpu_type is not None and self.gpus_per_node == 0:
            raise ValueError("gpu_type is set but gpus_per_node is 0; set gpus_per_node or remove gpu_type")
        if self.gpus_per_node and self.procs_per_node > self.gpus_per_node:
            raise ValueError(
                f"procs_per_node ({self.procs_per_node}) exceeds gpus_per_node ({self.gpus_per_node}); "
                "use one process per GPU"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


class KeepBest(_Strict):
    """Retention by quality: the `count` checkpoints with the best `metric`."""

    metric: str = Field(
        ...,
        min_length=1,
        description="a metric saved with each checkpoint: the templates save val_loss and val_accuracy; "
        "your own script, the metrics it passes to session.save",
    )
    mode: Literal["min", "max"] = Field("min", description="min when lower is better (a loss), max otherwise")
    count: int = Field(1, ge=1, le=1000, description="how many of the best checkpoints to keep (>= 1)")


class CheckpointSpec(_Strict):
    every_steps: int | Literal["auto"] = Field(
        50,
        description="steps between checkpoints (>= 1), or auto: the interval that costs least in saves plus "
        "work lost at a failure, from the measured save cost and mtbf_seconds (Young/Daly)",
    )
    mtbf_seconds: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="with every_steps: auto, the expected seconds between failures that leave no time for an "
        "emergency checkpoint; default one hour on spot capacity, one day otherwise",
    )
    grace_period_seconds: int = Field(
        60, ge=5, le=3600, description="seconds from SIGTERM (preemption) to kill: emergency checkpoint"
    )
    keep_last: int = Field(3, ge=1, description="keep the N checkpoints saved last (>= 1)")
    keep_best: KeepBest | None = Field(
        None, description="also keep the best checkpoints by a metric saved with them: {metric, mode, count}"
    )
    keep_every_steps: int | None = Field(
        None, ge=1, description="also keep every checkpoint whose step is a multiple of N (>= 1), e.g. 1000"
    )
    async_save: bool = Field(
        True,
        description="write periodic checkpoints in the background (replicated state: a writer process; FSDP and "
        "DeepSpeed: a thread of each rank); the loop waits only for a copy of the state",
    )
    store_uri: str | None = Field(
        None, description="local directory or s3://bucket/prefix; default: the project's data directory"
    )

    @field_validator("every_steps", mode="before")
    @classmethod
    def _steps_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if not isinstance(value, bool):  # True would pass as 1
            with contextlib.suppress(ValidationError):  # pydantic's own int rules: 50, "50", 50.0
                return _STEPS.validate_python(value)
        raise ValueError(f"every_steps must be a whole number of steps (>= 1) or auto; got {value!r}")

    @model_validator(mode="after")
    def _mtbf_only_for_auto(self) -> CheckpointSpec:
        if self.mtbf_seconds is not None and self.every_steps != "auto":
            raise ValueError("mtbf_seconds is used only with every_steps: auto; remove it or set every_steps: auto")
        return self

    @field_validator("store_uri")
    @classmethod
    def _uri_shape(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if "://" in value and not value.startswith("s3://"):
            raise ValueError(f"unsupported store URI {value!r}; use a local path or s3://bucket/prefix")
        if value.startswith("s3://") and not value[len("s3://") :].split("/")[0]:
            raise ValueError("s3 store URI has no bucket; use s3://bucket/prefix")
        return value


MAX_SCRIPT_BYTES = 256 << 10  # shipped inside the spec: a Kubernetes ConfigMap holds at most 1 MiB


class ScriptCode(_Strict):
    """The script's text, which travels with the run's spec: to a server on another machine, into the run
    registry, and to every job (a pod's ConfigMap), so the run needs no path that only the submitter can read."""

    sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the script's UTF-8 text")
    text: str = Field(..., description=f"the script (at most {MAX_SCRIPT_BYTES >> 10} KiB)")

    @model_validator(mode="after")
    def _matches(self) -> ScriptCode:
        data = self.text.encode()
        if len(data) > MAX_SCRIPT_BYTES:
            raise ValueError(
                f"the script is {len(data) >> 10} KiB; a script shipped with its run is at most "
                f"{MAX_SCRIPT_BYTES >> 10} KiB: build larger code into the image and run it with entrypoint.module"
            )
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ValueError("sha256 is not the SHA-256 of text; let tp fill entrypoint.code from entrypoint.script")
        return self


class EntrypointSpec(_Strict):
    """The user's own training code, run under torchrun/srun/Kubernetes exactly like a template."""

    script: str | None = Field(None, description="path to the user's train.py (relative to the spec file)")
    module: str | None = Field(None, description="a module to run with -m instead of a script, e.g. pkg.train")
    args: list[str] = Field(default_factory=list, description="arguments passed to the script or module")
    code: ScriptCode | None = Field(
        None,
        description="filled by tp from entrypoint.script: the script's text and hash, run wherever the file is not "
        "(one file: modules beside it are importable only where the script's own directory is)",
    )

    @model_validator(mode="after")
    def _one_of(self) -> EntrypointSpec:
        if (self.script is None) == (self.module is None):
            raise ValueError("set exactly one of entrypoint.script or entrypoint.module")
        if self.code is not None and self.script is None:
            raise ValueError("entrypoint.code comes with entrypoint.script only")
        return self


TEMPLATE_METRICS = ("accuracy", "loss")
"""What a model template's evaluation, and a script's default evaluation (a classifier's logits), report."""
_METRIC = r"^[a-z][a-z0-9_]{0,62}$"


class GateSpec(_Strict):
    """When a candidate takes the champion alias: its test metric against the champion's, on one test split."""

    metric: str = Field("accuracy", pattern=_METRIC, description="the evaluation metric the gate compares")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="maximize or minimize the metric")
    min_improvement: float = Field(
        0.0, ge=0, description="how much better than the champion the candidate must be (0: any improvement)"
    )


class EvaluationSpec(_Strict):
    """What the evaluation of a run's final checkpoint on its snapshot's test split reports, and the gate."""

    metrics: list[Annotated[str, Field(pattern=_METRIC)]] = Field(
        default_factory=lambda: list(TEMPLATE_METRICS),
        min_length=1,
        description="the test metrics the evaluation must report (lowercase names: letters, digits, _)",
    )
    gate: GateSpec = Field(default_factory=GateSpec, description="the promotion gate")

    @model_validator(mode="after")
    def _gate_metric_reported(self) -> EvaluationSpec:
        if self.gate.metric not in self.metrics:
            raise ValueError(
                f"gate.metric {self.gate.metric!r} is not among metrics ({', '.join(self.metrics)}); add it there"
            )
        return self


class PreemptionPolicy(_Strict):
    """What happens when spot capacity is taken away, and after failures that are not preemptions."""

    max_preemptions: int = Field(20, ge=0, description="preemptions after which the run is not resumed again")
    fallback_to_ondemand_after: int = Field(
        3, ge=0, description="preemptions on spot after which the run resumes on on-demand capacity"
    )
    max_restarts: int = Field(
        0, ge=0, le=100, description="restarts of the process group after a rank dies (torchrun --max-restarts)"
    )
    retry_failures: int = Field(0, ge=0, le=10, description="resubmissions allowed after a failure (not a preemption)")
    notice_provider: Literal["none", "aws", "gcp", "azure"] = Field(
        "none", description="cloud whose instance metadata announces spot interruptions: none, aws, gcp or azure"
    )
    notice_url: str | None = Field(None, description="metadata URL to poll instead of the provider's default")
    notice_poll_seconds: float = Field(5.0, gt=0, le=60, description="seconds between metadata polls")


class DeepSpeedOptions(_Strict):
    """DeepSpeed ZeRO settings; used when strategy is deepspeed."""

    zero_stage: Literal[1, 2, 3] = Field(2, description="ZeRO stage: 1 (optimizer states), 2 (+grads), 3 (+weights)")
    offload_optimizer: bool = Field(False, description="keep optimizer states and step on the CPU (ZeRO-Offload)")
    offload_params: bool = Field(False, description="keep weights on the CPU between uses (stage 3 only)")

    @model_validator(mode="after")
    def _offload_params_needs_stage3(self) -> DeepSpeedOptions:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage 3; set deepspeed.zero_stage: 3 or drop offload_params")
        return self


class CostSpec(_Strict):
    """Cost estimate, deadline and cap: checked against the team budget at submission."""

    expected_hours: float | None = Field(
        None, gt=0, description="expected wall-clock hours (> 0); estimates the cost at submission"
    )
    deadline: datetime | None = Field(
        None, description="finish by this time (ISO 8601); a cost window may delay the start until before it"
    )
    max_usd: float | None = Field(None, gt=0, description="spending cap in dollars (> 0); counted against the budget")


class SlurmOptions(_Strict):
    """Slurm-only settings; the launcher derives the rest from `resources`."""

    # Written into #SBATCH lines: one word each, so no value can start a line of its own.
    partition: str | None = Field(
        None,
        pattern=SLURM_NAME,
        description="Slurm partition, one of the team's (letters, digits, . _ -); default: from resources.spot "
        "(spot -> 'spot', else 'ondemand')",
    )
    qos: str | None = Field(
        None,
        pattern=SLURM_NAME,
        description="Slurm QoS, one of the team's (letters, digits, . _ -); default: from resources.priority",
    )
    account: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm account to charge (letters, digits, . _ -); default: the team's"
    )
    time_limit: str = Field(
        "01:00:00", pattern=r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$", description="wall time limit, [D-]HH:MM:SS"
    )


class KubernetesOptions(_Strict):
    """Kubernetes (Kueue) settings; the launcher derives the rest from `resources`."""

    image: str | None = Field(
        None, description="training image; must match the launcher's approved registries; default: launcher's"
    )
    queue: str | None = Field(
        None, pattern=K8S_NAME, description="Kueue LocalQueue (a DNS label); default and only choice: the team's"
    )
    namespace: str | None = Field(
        None, pattern=K8S_NAME, description="namespace to run in (a DNS label); default and only choice: the team's"
    )
    placement: Literal["none", "same-rack", "same-block"] = Field(
        "none", description="topology-aware placement of all nodes: none, same-rack or same-block"
    )
    placement_required: bool = Field(
        True, description="true: wait for a domain that fits (required); false: best effort (preferred)"
    )
    service_account: str | None = Field(
        None, pattern=K8S_NAME, description="service account of the pods (a DNS label); default: the team's"
    )
    secret_refs: tuple[Annotated[str, Field(pattern=K8S_NAME)], ...] = Field(
        (),
        description="names of Secrets (DNS labels) to expose as environment variables, among those the team "
        "declares (by reference, never inline)",
    )


class TrainSpec(_Strict):
    """Everything needed to launch, reproduce and account for one training run."""

    name: str = Field(..., pattern=_SLUG, description="run family name: lowercase letters, digits, dashes")
    team: str = Field(..., pattern=_SLUG, description="owning team: lowercase letters, digits, dashes")
    owner: str = Field(..., min_length=1, max_length=128, description="person responsible for the run")
    task: str = Field("classification", min_length=1, max_length=64, description="task label")
    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    entrypoint: EntrypointSpec | None = Field(
        None, description="run the user's own script or module instead of the model template's loop"
    )
    evaluation: EvaluationSpec | None = Field(
        None,
        description="test metrics and the promotion gate (default: accuracy and loss, the gate on accuracy); a "
        "script's run is evaluated and registered when its spec has this section",
    )
    strategy: str = Field("ddp", description=f"distributed strategy, one of {', '.join(STRATEGIES)}")
    deepspeed: DeepSpeedOptions = Field(default_factory=DeepSpeedOptions, description="DeepSpeed ZeRO settings")
    resources: ResourceRequest = Field(default_factory=ResourceRequest)
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy, description="preemption and retry policy")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    backend: Literal["local", "slurm", "k8s"] = Field("local", description="local, slurm or k8s")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions, description="Slurm-only settings")
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions, description="Kubernetes-only settings")
    cost: CostSpec = Field(default_factory=CostSpec, description="expected hours, deadline and dollar cap")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        if value not in STRATEGIES:
            raise ValueError(f"unknown strategy {value!r}; use one of: {', '.join(STRATEGIES)}")
        return value

    @model_validator(mode="after")
    def _template_metrics(self) -> TrainSpec:
        unknown = [m for m in self.evaluated.metrics if m not in TEMPLATE_METRICS]
        if self.entrypoint is None and unknown:
            raise ValueError(
                f"evaluation.metrics: model templates report {' and '.join(TEMPLATE_METRICS)}, not "
                f"{', '.join(unknown)}; remove them, or train your own script (entrypoint) that reports them"
            )
        columns = self.dataset.columns
        roles = [role for role in ("text", "image") if columns is not None and getattr(columns, role) is not None]
        if self.entrypoint is None and roles:
            raise ValueError(
                f"dataset.columns.{roles[0]}: model templates read numeric features only; train your own script "
                f"(entrypoint.script), which reads the {roles[0]} as batch.{roles[0]}"
            )
        return self

    @property
    def evaluated(self) -> EvaluationSpec:
        """The evaluation section, or its defaults."""
        return self.evaluation or EvaluationSpec()

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON form: the same spec always hashes the same."""
        data = self.model_dump(mode="json")
        if data["evaluation"] is None:  # a field added later: specs without it keep the hash they had
            del data["evaluation"]
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()

    def with_snapshot(self, snapshot_id: str) -> TrainSpec:
        return self.model_copy(update={"dataset": self.dataset.model_copy(update={"snapshot_id": snapshot_id})})


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def parse_spec(data: Any, source: str = "spec") -> TrainSpec:
    """Validate a mapping into a TrainSpec, or raise SpecError naming each bad field and its fix."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields at the top level, got {type(data).__name__}")
    try:
        return TrainSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, TrainSpec, source)) from None


def read_yaml_file(path: Path, kind: str) -> Any:
    """The parsed YAML (or JSON) of a spec-like file, or a SpecError naming the file and the fix."""
    if not path.is_file():
        raise SpecError(f"{kind} file {path} does not exist; pass the path to a YAML {kind} (see examples/)")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc.__class__.__name__}: {exc}); fix the syntax") from None


def load_spec(path: str | Path) -> TrainSpec:
    """Read a YAML (or JSON) spec file and validate it."""
    path = Path(path)
    spec = parse_spec(read_yaml_file(path, "spec"), source=str(path))
    return with_script_code(with_data_path(spec, path.parent), path.parent)


def with_data_path(spec: TrainSpec, base: Path) -> TrainSpec:
    """The spec with a relative path to its own files resolved against `base` (the spec file's directory):
    the platform server that builds the snapshot may run anywhere."""
    source = spec.dataset.source
    if not spec.dataset.is_file_source or source is None or "://" in source:
        return spec
    path = Path(source).expanduser()
    absolute = str(path if path.is_absolute() else (base / path).resolve())
    return spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"source": absolute})})


def with_script_code(spec: TrainSpec, base: Path) -> TrainSpec:
    """The spec with its script's path resolved against `base` (the directory of the file that names it) and
    the script's text beside it (entrypoint.code), read here, where the file is."""
    entrypoint = spec.entrypoint
    if entrypoint is None or entrypoint.script is None:
        return spec
    # Scripts are named relative to the spec that names them, wherever `tp` runs from.
    script = Path(entrypoint.script) if Path(entrypoint.script).is_absolute() else (base / entrypoint.script).resolve()
    update: dict[str, Any] = {"script": str(script)}
    if script.is_file():  # a missing script is refused by the preflight, with its fix
        data = script.read_bytes()  # bytes, not text mode: no newline translation, so the hash is the file's
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(f"entrypoint.script: {script} is not UTF-8 text; name a Python script") from None
        try:
            update["code"] = ScriptCode(sha256=hashlib.sha256(data).hexdigest(), text=text)
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc, ScriptCode, f"entrypoint.script {script}")) from None
    return spec.model_copy(update={"entrypoint": entrypoint.model_copy(update=update)})


def format_validation_error(exc: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            parent = _model_at(model, error["loc"][:-1])
            known = ", ".join(parent.model_fields) if parent else ""
            message = f"unknown field; remove it or use one of: {known}"
        elif error["type"] == "missing":
            message = f"required field is missing; add it ({_describe(model, error['loc'])})"
        else:
            got = error.get("input")
            # An item of a list field is described by its field.
            loc = tuple(part for part in error["loc"] if not isinstance(part, int))
            description = _describe(model, loc)
            if error["type"] == "string_pattern_mismatch":
                message = "is not allowed (characters or length)"
            if not isinstance(got, dict):
                message = f"{message} (got {got!r})"
            if description and description not in message:
                message = f"{message}; expected: {description}"
        lines.append(f"{source}: {field}: {message}")
    return "\n".join(lines)


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(str(part))
        # An optional section (`keep_best: KeepBest | None`) is described by its model.
        members = get_args(field.annotation) or (field.annotation,) if field else ()
        found = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if not found:
            return None
        model = found[0]
    return model


def _describe(model: type[BaseModel], loc: tuple) -> str:
    if not loc:
        return ""
    parent = _model_at(model, loc[:-1])
    field = parent.model_fields.get(str(loc[-1])) if parent else None
    return (field.description or "") if field else ""
