"""The Optuna side of a sweep: storage, sampler, pruner and the study, rebuilt the same way everywhere.

The orchestrator and each trial's worker both open the study from its RDB storage; the pruner is
not stored by Optuna, so both build it from the same PrunerSpec.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from training_platform.errors import PlatformError
from training_platform.sweeps.spec import PrunerSpec, SamplerSpec, SweepSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)


STORAGE_ENV = "TP_SWEEP_STORAGE"  # the team's study database (URL with its password): jobs get it too (job_env.py)


def default_storage_url(home_root: Path) -> str:
    return f"sqlite:///{Path(home_root) / 'sweeps.db'}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage; SQLite waits for its lock instead of failing when trials report at once."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=None)


def build_sampler(spec: SamplerSpec) -> optuna.samplers.BaseSampler:
    if spec.type == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    if spec.type == "grid":
        # The grid is enqueued as fixed trials (see enqueue_grid): Optuna's GridSampler stops the
        # study from inside tell(), which only works under study.optimize, not ask/tell.
        return optuna.samplers.RandomSampler(seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=spec.n_startup_trials)


def build_pruner(spec: PrunerSpec) -> optuna.pruners.BasePruner:
    if spec.type == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_resource, reduction_factor=spec.reduction_factor
        )
    if spec.type == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=spec.min_resource,
            max_resource=spec.max_resource or "auto",
            reduction_factor=spec.reduction_factor,
        )
    if spec.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.n_startup_trials, n_warmup_steps=spec.n_warmup_steps)
    return optuna.pruners.NopPruner()


def open_study(sweep: SweepSpec, storage_url: str) -> optuna.Study:
    """Create the sweep's study, or load it when it exists (a sweep survives restarts)."""
    return optuna.create_study(
        study_name=sweep.name,
        storage=open_storage(storage_url),
        sampler=build_sampler(sweep.sampler),
        pruner=build_pruner(sweep.pruner),
        direction=sweep.objective.direction,
        load_if_exists=True,
    )


def distributions(sweep: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for path, p in sweep.search_space.items():
        if p.type == "categorical":
            out[path] = optuna.distributions.CategoricalDistribution(list(p.choices or ()))
        elif p.type == "int":
            step = int(p.step) if p.step and not p.log else 1
            out[path] = optuna.distributions.IntDistribution(int(p.low), int(p.high), log=p.log, step=step)  # type: ignore[arg-type]
        else:
            out[path] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.log)  # type: ignore[arg-type]
    return out


def grid_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    paths = list(sweep.search_space)
    return [dict(zip(paths, values, strict=True)) for values in itertools.product(
        *(sweep.search_space[p].grid() for p in paths)
    )]


def enqueue_grid(study: optuna.Study, sweep: SweepSpec) -> int:
    """Enqueue every grid point not already in the study; the number of grid points."""
    points = grid_points(sweep)
    for params in points:
        study.enqueue_trial(params, skip_if_exists=True)
    return len(points)


def storage_url_for(sweep: SweepSpec, home_root: Path) -> str:
    return sweep.storage or os.environ.get(STORAGE_ENV) or default_storage_url(home_root)


def public_url(url: str) -> str:
    """URL with its password hidden: what the sweep's records, summaries and trial files carry."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def private_url(public: str, environ: Mapping[str, str] = os.environ) -> str:
    """The storage URL that PUBLIC stands for: itself where it holds no password, else STORAGE_ENV's, whose password
    it hides (the one place the password is: the server's environment, which jobs get)."""
    from sqlalchemy.engine import make_url

    if make_url(public).password is None:
        return public
    configured = environ.get(STORAGE_ENV)
    if configured and public_url(configured) == public:
        return configured
    raise PlatformError(
        f"the sweep's study storage {public} needs its password: set {STORAGE_ENV} to that URL in the environment "
        "of the platform server (and so of its jobs)"
    )
