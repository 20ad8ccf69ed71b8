"""SweepSpec: a base TrainSpec, a search space, a sampler, a pruner, limits and a deadline (YAML)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training_platform.errors import SpecError
from training_platform.spec import (
    _SLUG,
    TrainSpec,
    format_validation_error,
    parse_spec,
    read_yaml_file,
    with_script_code,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Param(_Strict):
    """One dimension of the search space; its key is a dotted TrainSpec path, e.g. training.learning_rate."""

    type: Literal["float", "int", "categorical"] = Field(..., description="float, int or categorical")
    low: float | None = Field(None, description="lower bound (float/int)")
    high: float | None = Field(None, description="upper bound (float/int)")
    log: bool = Field(False, description="sample on a log scale (float/int, low > 0)")
    step: float | None = Field(None, gt=0, description="grid step (float/int); required for grid on numbers")
    choices: tuple[Any, ...] | None = Field(None, description="values to choose from (categorical)")

    @model_validator(mode="after")
    def _bounds(self) -> Param:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical parameters need `choices: [...]`")
            return self
        if self.low is None or self.high is None or self.low >= self.high:
            raise ValueError("numeric parameters need low < high")
        if self.log and self.low <= 0:
            raise ValueError("log-scale parameters need low > 0")
        return self

    def grid(self) -> list[Any]:
        if self.type == "categorical":
            return list(self.choices or ())
        if self.step is None:
            raise ValueError("grid sampling needs `step` on every numeric parameter")
        values, value = [], self.low
        while value <= self.high + 1e-12:  # type: ignore[operator]
            values.append(int(value) if self.type == "int" else round(value, 12))  # type: ignore[arg-type]
            value += self.step  # type: ignore[operator]
        return values


class SamplerSpec(_Strict):
    type: Literal["tpe", "random", "grid"] = Field("tpe", description="tpe, random or grid")
    seed: int = Field(0, ge=0, description="sampler seed: same seed, same suggestions")
    n_startup_trials: int = Field(4, ge=0, description="random trials before TPE models the space (tpe)")


class PrunerSpec(_Strict):
    type: Literal["asha", "hyperband", "median", "none"] = Field("asha", description="asha, hyperband, median or none")
    min_resource: int = Field(1, ge=1, description="reports before a trial can be pruned (asha, hyperband)")
    reduction_factor: int = Field(3, ge=2, description="keep 1/reduction_factor of trials per rung (asha, hyperband)")
    max_resource: int | None = Field(None, ge=1, description="reports of a full trial (hyperband); default: derived")
    n_startup_trials: int = Field(2, ge=0, description="trials that finish before pruning starts (median)")
    n_warmup_steps: int = Field(0, ge=0, description="steps before a trial can be pruned (median)")


class ObjectiveSpec(_Strict):
    metric: str = Field("val_accuracy", description="metric the worker reports, e.g. val_accuracy or val_loss")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="maximize or minimize")


class SweepLimits(_Strict):
    max_trials: int = Field(12, ge=1, le=10_000, description="trials to run (>= 1)")
    parallel_trials: int = Field(1, ge=1, le=256, description="trials running at once (>= 1)")
    max_gpu_hours: float | None = Field(None, gt=0, description="stop starting trials past this many GPU-hours")
    max_usd: float | None = Field(None, gt=0, description="stop starting trials past this spend; budget estimate")


class SweepSpec(_Strict):
    """A hyper-parameter sweep whose trials are training_run partitions."""

    name: str = Field(..., pattern=_SLUG, description="sweep name (Optuna study name): lowercase, digits, dashes")
    base: dict[str, Any] = Field(..., description="the TrainSpec every trial starts from (a mapping)")
    search_space: dict[str, Param] = Field(..., min_length=1, description="dotted TrainSpec path -> parameter")
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    limits: SweepLimits = Field(default_factory=SweepLimits)
    deadline: datetime | None = Field(None, description="finish by (ISO 8601); trials start in the cheapest window")
    storage: str | None = Field(None, description="Optuna RDB URL; default: sqlite:///$TP_HOME/sweeps.db")

    @field_validator("storage")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        if not url:
            return url
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            password = make_url(url).password
        except ArgumentError as exc:
            raise ValueError(f"not a database URL ({exc}); e.g. postgresql+psycopg2://user@host/optuna") from None
        if password is not None:
            raise ValueError(
                "holds a password, which would be recorded with the sweep's spec; leave storage out and set "
                "TP_SWEEP_STORAGE to the URL in the platform server's environment"
            )
        return url

    @field_validator("search_space")
    @classmethod
    def _paths_exist(cls, space: dict[str, Param]) -> dict[str, Param]:
        for path in space:
            model: type[BaseModel] = TrainSpec
            parts = path.split(".")
            for i, part in enumerate(parts):
                field = model.model_fields.get(part)
                if field is None:
                    raise ValueError(f"search_space key {path!r}: {part!r} is not a TrainSpec field")
                annotation = field.annotation
                if i < len(parts) - 1:
                    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                        raise ValueError(f"search_space key {path!r}: {part!r} has no sub-fields")
                    model = annotation
        return space

    @model_validator(mode="after")
    def _grid_is_complete(self) -> SweepSpec:
        if self.sampler.type == "grid":
            for path, param in self.search_space.items():
                if param.type != "categorical" and param.step is None:
                    raise ValueError(f"grid sampler: search_space.{path} needs `step`")
        return self

    @property
    def base_spec(self) -> TrainSpec:
        return parse_spec(self.base, source=f"sweep {self.name}: base")

    @property
    def team(self) -> str:
        return self.base_spec.team

    def trial_spec(self, params: dict[str, Any], trial_number: int) -> TrainSpec:
        """The base spec with the trial's parameters set at their dotted paths.

        The name stays the base's, so every trial's MLflow run lands in one experiment, nested
        under the sweep's parent run; the run id tells trials apart.
        """
        data = self.base_spec.model_dump(mode="json")
        for path, value in params.items():
            node = data
            *parents, leaf = path.split(".")
            for part in parents:
                node = node[part]
            node[leaf] = value
        return parse_spec(data, source=f"sweep {self.name}: trial {trial_number}")


def parse_sweep(data: Any, source: str = "sweep") -> SweepSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields at the top level")
    try:
        sweep = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, SweepSpec, source)) from None
    sweep.base_spec  # noqa: B018 - validates the base now, at the edge
    return sweep


def load_sweep(path: str | Path) -> SweepSpec:
    """Read a sweep file; a base spec's script is resolved against the file and its text shipped with the sweep."""
    path = Path(path)
    sweep = parse_sweep(read_yaml_file(path, "sweep"), source=str(path))
    base = sweep.base_spec
    shipped = with_script_code(base, path.parent)
    if shipped is base:
        return sweep
    entrypoint = shipped.entrypoint.model_dump(mode="json", exclude_none=True)
    return sweep.model_copy(update={"base": {**sweep.base, "entrypoint": entrypoint}})
