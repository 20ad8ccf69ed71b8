"""Run a sweep: ask Optuna for trials, launch each as a training run, tell Optuna how it ended.

How a trial is launched is a callable (`run_trial(spec, run_id)`): the CLI and the sweep asset pass
one that materializes the trial's `training_run` partition through Dagster; tests and benchmarks may
pass one that calls a launcher directly. Each trial's outcome is read from its run directory.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import optuna
from optuna.trial import TrialState

from training_platform.cost import load_price_model, run_cost
from training_platform.paths import PlatformHome
from training_platform.runs import read_result, register_run
from training_platform.spec import TrainSpec
from training_platform.sweeps.spec import SweepSpec
from training_platform.sweeps.study import distributions, enqueue_grid, open_study, storage_url_for
from training_platform.sweeps.trial import TrialContext

TrialRunner = Callable[[TrainSpec, str], Any]


@dataclass
class TrialOutcome:
    number: int
    run_id: str
    state: str  # COMPLETE, PRUNED or FAIL (Optuna's names)
    value: float | None
    steps: int
    params: dict[str, Any]
    train_seconds: float = 0.0
    accelerator_hours: float = 0.0
    cost_usd: float = 0.0
    error: str | None = None


@dataclass
class SweepResult:
    sweep: str
    storage: str
    direction: str
    trials: list[TrialOutcome] = field(default_factory=list)
    best: TrialOutcome | None = None
    best_spec: dict | None = None
    parent_mlflow_run_id: str | None = None
    stopped_by: str = "max_trials"

    @property
    def total_steps(self) -> int:
        return sum(t.steps for t in self.trials)

    def counts(self) -> dict[str, int]:
        return {s: sum(t.state == s for t in self.trials) for s in ("COMPLETE", "PRUNED", "FAIL")}

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "status": "SUCCEEDED" if self.best is not None else "FAILED",
            "storage": self.storage,
            "trials": len(self.trials),
            **{s.lower(): n for s, n in self.counts().items()},
            "total_steps": self.total_steps,
            "total_cost_usd": round(sum(t.cost_usd for t in self.trials), 6),
            "best_trial": self.best.number if self.best else None,
            "best_run_id": self.best.run_id if self.best else None,
            "best_value": self.best.value if self.best else None,
            "best_params": self.best.params if self.best else None,
            "best_spec": self.best_spec,
            "stopped_by": self.stopped_by,
            "parent_mlflow_run_id": self.parent_mlflow_run_id,
            "trial_table": [asdict(t) for t in self.trials],
        }


def run_sweep(
    sweep: SweepSpec,
    home: PlatformHome,
    run_trial: TrialRunner,
    *,
    parent_mlflow_run_id: str | None = None,
    on_trial: Callable[[TrialOutcome], None] | None = None,
) -> SweepResult:
    """Run trials until max_trials (counting those a previous attempt finished), a cost limit, or the deadline."""
    storage = storage_url_for(sweep, home.root)
    study = open_study(sweep, storage)
    _fail_orphans(study)
    result = SweepResult(sweep.name, storage, sweep.objective.direction, parent_mlflow_run_id=parent_mlflow_run_id)
    result.trials = _previous_outcomes(study)
    dists = distributions(sweep)
    limits = sweep.limits
    max_trials = limits.max_trials
    if sweep.sampler.type == "grid":
        max_trials = min(max_trials, enqueue_grid(study, sweep))
    prices = load_price_model()

    def finished_count() -> int:
        return sum(t.state in ("COMPLETE", "PRUNED") for t in result.trials)

    def may_start(running: int) -> str | None:
        """Why no further trial may start (None: it may)."""
        if finished_count() + running >= max_trials:
            return "max_trials"
        if limits.max_gpu_hours is not None and sum(t.accelerator_hours for t in result.trials) >= limits.max_gpu_hours:
            return "max_gpu_hours"
        if limits.max_usd is not None and sum(t.cost_usd for t in result.trials) >= limits.max_usd:
            return "max_usd"
        if sweep.deadline is not None and datetime.now(UTC) >= sweep.deadline:
            return "deadline"
        return None

    def launch(trial: optuna.Trial) -> tuple[optuna.Trial, TrainSpec, str, Any]:
        spec = sweep.trial_spec(trial.params, trial.number)
        run_id = f"{sweep.name}-t{trial.number:03d}-{secrets.token_hex(2)}"[:63]
        register_run(home, spec, run_id)
        TrialContext(
            sweep=sweep.name,
            storage=storage,
            trial_id=trial._trial_id,  # the storage's id, which a worker needs to re-open this trial
            trial_number=trial.number,
            metric=sweep.objective.metric,
            direction=sweep.objective.direction,
            pruner=sweep.pruner.model_dump(mode="json"),
            parent_mlflow_run_id=parent_mlflow_run_id,
        ).write(home.run_dir(run_id))
        trial.set_user_attr("run_id", run_id)
        started = time.monotonic()
        try:
            error = run_trial(spec, run_id)
        except Exception as exc:  # noqa: BLE001 - a failed trial is recorded, the sweep goes on
            error = f"{type(exc).__name__}: {exc}"
        return trial, spec, run_id, (error, time.monotonic() - started)

    with ThreadPoolExecutor(max_workers=limits.parallel_trials, thread_name_prefix="trial") as pool:
        pending: set[Future] = set()
        while True:
            while (reason := may_start(len(pending))) is None:
                pending.add(pool.submit(launch, study.ask(dists)))
            result.stopped_by = reason
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                trial, spec, run_id, (error, seconds) = future.result()
                outcome = _tell(study, trial, spec, run_id, home, error, sweep, prices, seconds)
                result.trials.append(outcome)
                if on_trial is not None:
                    on_trial(outcome)

    result.best = _best(result.trials, sweep.objective.direction)
    if result.best is not None:
        result.best_spec = sweep.trial_spec(result.best.params, result.best.number).model_dump(mode="json")
    return result


def _tell(study, trial, spec, run_id, home, error, sweep, prices, seconds) -> TrialOutcome:
    run = read_result(home, run_id)
    outcome = TrialOutcome(trial.number, run_id, "FAIL", None, 0, dict(trial.params))
    if run is None or run.get("status") not in ("SUCCEEDED", "PRUNED"):
        outcome.error = str(error or "the trial wrote no result; see its worker.log")
        study.tell(trial, state=TrialState.FAIL)
        return outcome
    outcome.steps = int(run["final_step"])
    outcome.train_seconds = float(run.get("train_seconds", seconds))
    cost = run_cost(spec, run_id, outcome.train_seconds, sweep=sweep.name, model=prices)
    outcome.accelerator_hours, outcome.cost_usd = cost.accelerator_hours, cost.total_usd
    value = (run.get("metrics") or {}).get(sweep.objective.metric)
    outcome.value = None if value is None else float(value)
    if run["status"] == "PRUNED":
        outcome.state = "PRUNED"
        study.tell(trial, state=TrialState.PRUNED)
    elif outcome.value is None:
        outcome.error = f"the trial reported no {sweep.objective.metric!r}; check objective.metric"
        study.tell(trial, state=TrialState.FAIL)
    else:
        outcome.state = "COMPLETE"
        study.tell(trial, outcome.value)
    return outcome


def _best(trials: list[TrialOutcome], direction: str) -> TrialOutcome | None:
    complete = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    if not complete:
        return None
    pick = max if direction == "maximize" else min
    return pick(complete, key=lambda t: t.value)  # type: ignore[arg-type, return-value]


def _fail_orphans(study: optuna.Study) -> None:
    """Trials left RUNNING by an orchestrator that died cannot report back: close them as failed."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)


def _previous_outcomes(study: optuna.Study) -> list[TrialOutcome]:
    outcomes = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        steps = max(t.intermediate_values) if t.intermediate_values else 0
        outcomes.append(
            TrialOutcome(t.number, t.user_attrs.get("run_id", ""), t.state.name, t.value, steps, dict(t.params))
        )
    return outcomes
