"""A sweep, one step at a time: tell Optuna how finished trials ended, ask it for the trials to start next.

The driver keeps nothing between steps. Everything lives in the study's RDB storage (each trial's
params, its run id and outcome as user attributes) and in the trials' run directories, so whoever
calls `step` (the server's sweep sensor every few seconds, `run_sweep` in a loop) can die between two
steps and lose nothing: a trial asked for but never submitted is handed out again under the same run
id, and submitting a run id twice starts it once (the sensor's run key is the run id).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from training_platform.cost.accounting import summed
from training_platform.cost.backends import open_ledger
from training_platform.paths import PlatformHome
from training_platform.runs.specs import is_registered, read_result, register_run
from training_platform.spec import TrainSpec
from training_platform.sweeps.spec import SweepSpec
from training_platform.sweeps.study import (
    distributions,
    enqueue_grid,
    grid_points,
    open_study,
    public_url,
    storage_url_for,
)
from training_platform.sweeps.trial import TrialContext

RUN_ID_ATTR = "run_id"


class TrialRun(StrEnum):
    """Where a trial's training run is, as the orchestrator sees it."""

    UNKNOWN = "unknown"  # never submitted (or not visible yet): hand it out again
    RUNNING = "running"  # queued, training, or preempted and about to resume
    FINISHED = "finished"  # succeeded: its result is in its run directory
    FAILED = "failed"


@dataclass(frozen=True)
class RunState:
    state: TrialRun
    error: str | None = None


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
            "storage": public_url(self.storage),
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


@dataclass(frozen=True)
class Launch:
    """A trial to submit: its run id (registered, with its trial context) and its spec."""

    run_id: str
    spec: TrainSpec
    trial_number: int


@dataclass
class SweepStep:
    launch: list[Launch] = field(default_factory=list)  # new trials, and trials to submit again
    told: list[TrialOutcome] = field(default_factory=list)  # trials that ended since the last step
    running: int = 0
    result: SweepResult | None = None  # set once the sweep is over: no trial running, none may start

    @property
    def done(self) -> bool:
        return self.result is not None


class SweepDriver:
    def __init__(
        self,
        sweep: SweepSpec,
        home: PlatformHome,
        parent_mlflow_run_id: str | None = None,
        trials_until: datetime | None = None,
    ):
        self.sweep = sweep
        self.home = home
        self.parent_mlflow_run_id = parent_mlflow_run_id
        self.trials_until = trials_until  # the cost window's end: no trial is released after it
        self.storage = storage_url_for(sweep, home.root)
        self.study = open_study(sweep, self.storage)
        self.max_trials = sweep.limits.max_trials
        if sweep.sampler.type == "grid":
            self.max_trials = min(self.max_trials, len(grid_points(sweep)))

    @classmethod
    def start(cls, sweep: SweepSpec, home: PlatformHome, parent_mlflow_run_id: str | None = None) -> SweepDriver:
        """The sweep's study created (or found), with a grid sampler's points enqueued once."""
        driver = cls(sweep, home, parent_mlflow_run_id)
        if sweep.sampler.type == "grid":
            enqueue_grid(driver.study, sweep)
        return driver

    def step(self, run_state: Callable[[str], RunState]) -> SweepStep:
        """Tell the ended trials, then ask for as many new ones as the limits allow."""
        out = SweepStep()
        running = 0
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            run_id = trial.user_attrs.get(RUN_ID_ATTR)
            if run_id is None or not is_registered(self.home, run_id):
                self.study.tell(trial.number, state=TrialState.FAIL)  # asked, but died before it had a run
                continue
            state = run_state(run_id)
            if state.state in (TrialRun.FINISHED, TrialRun.FAILED):
                out.told.append(self._tell(trial, run_id, state))
                continue
            running += 1
            if state.state == TrialRun.UNKNOWN:
                out.launch.append(Launch(run_id, self._trial_spec(trial), trial.number))
        outcomes = self.outcomes()
        while (stop := self._stop_reason(outcomes, running)) is None:
            out.launch.append(self._launch(self.study.ask(distributions(self.sweep))))
            running += 1
        out.running = running
        if not running:
            out.result = self._result(outcomes, stop)
        return out

    def _launch(self, trial: optuna.Trial) -> Launch:
        spec = self.sweep.trial_spec(trial.params, trial.number)
        run_id = f"{self.sweep.name}-t{trial.number:03d}-{secrets.token_hex(2)}"[:63]
        context = TrialContext(
            sweep=self.sweep.name,
            storage=public_url(self.storage),
            trial_id=trial._trial_id,  # the storage's id, which a worker needs to re-open this trial
            trial_number=trial.number,
            metric=self.sweep.objective.metric,
            direction=self.sweep.objective.direction,
            pruner=self.sweep.pruner.model_dump(mode="json"),
            parent_mlflow_run_id=self.parent_mlflow_run_id,
        )
        register_run(self.home, spec, run_id, trial=asdict(context))
        trial.set_user_attr(RUN_ID_ATTR, run_id)  # last: a trial with a run id has a registered run
        return Launch(run_id, spec, trial.number)

    def _trial_spec(self, trial: FrozenTrial) -> TrainSpec:
        return self.sweep.trial_spec(trial.params, trial.number)

    def _stop_reason(self, outcomes: list[TrialOutcome], running: int) -> str | None:
        """Why no further trial may start (None: it may)."""
        limits = self.sweep.limits
        finished = sum(t.state in ("COMPLETE", "PRUNED") for t in outcomes)
        if finished + running >= self.max_trials:
            return "max_trials"
        if sum(t.state == "FAIL" and bool(t.run_id) for t in outcomes) >= self.max_trials:
            return "failures"  # as many failed trials as were asked for: the next would fail too
        if running >= limits.parallel_trials:
            return "parallel_trials"
        if limits.max_gpu_hours is not None and sum(t.accelerator_hours for t in outcomes) >= limits.max_gpu_hours:
            return "max_gpu_hours"
        if limits.max_usd is not None and sum(t.cost_usd for t in outcomes) >= limits.max_usd:
            return "max_usd"
        if self.sweep.deadline is not None and datetime.now(UTC) >= self.sweep.deadline:
            return "deadline"
        if self.trials_until is not None and datetime.now(UTC) >= self.trials_until:
            return "window_closed"
        return None

    def _tell(self, trial: FrozenTrial, run_id: str, state: RunState) -> TrialOutcome:
        outcome = TrialOutcome(trial.number, run_id, "FAIL", None, 0, dict(trial.params))
        # Every attempt of the trial, failed ones too, as the training asset charged them (cost/charges.py).
        charged = summed(open_ledger(self.home.root).records(run=run_id))
        outcome.accelerator_hours, outcome.cost_usd = charged["accelerator_hours"], charged["total_usd"]
        run = read_result(self.home, run_id) if state.state == TrialRun.FINISHED else None
        if run is None or run.get("status") not in ("SUCCEEDED", "PRUNED"):
            outcome.error = state.error or "the trial wrote no result; see its worker.log"
        else:
            outcome.steps = int(run["final_step"])
            outcome.train_seconds = float(run.get("train_seconds", 0.0))
            value = (run.get("metrics") or {}).get(self.sweep.objective.metric)
            outcome.value = None if value is None else float(value)
            if run["status"] == "PRUNED":
                outcome.state = "PRUNED"
            elif outcome.value is None:
                outcome.error = f"the trial reported no {self.sweep.objective.metric!r}; check objective.metric"
            else:
                outcome.state = "COMPLETE"
        # Kept on the trial, so that any later step rebuilds the outcome without the run directory.
        live = optuna.trial.Trial(self.study, trial._trial_id)
        for key in ("steps", "train_seconds", "accelerator_hours", "cost_usd", "error"):
            live.set_user_attr(key, getattr(outcome, key))
        if outcome.state == "COMPLETE":
            self.study.tell(trial.number, outcome.value)
        else:
            self.study.tell(trial.number, state=TrialState[outcome.state])
        return outcome

    def outcomes(self) -> list[TrialOutcome]:
        """Every ended trial, in trial order."""
        ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        outcomes = []
        for t in self.study.get_trials(deepcopy=False, states=ended):
            attrs = t.user_attrs
            steps = attrs.get("steps", max(t.intermediate_values) if t.intermediate_values else 0)
            outcomes.append(
                TrialOutcome(
                    t.number, attrs.get(RUN_ID_ATTR, ""), t.state.name, t.value, steps, dict(t.params),
                    attrs.get("train_seconds", 0.0), attrs.get("accelerator_hours", 0.0), attrs.get("cost_usd", 0.0),
                    attrs.get("error"),
                )
            )
        return outcomes

    def _result(self, outcomes: list[TrialOutcome], stopped_by: str | None) -> SweepResult:
        result = SweepResult(
            self.sweep.name, self.storage, self.sweep.objective.direction,
            trials=[t for t in outcomes if t.run_id],  # trials that died before they had a run are not trials
            parent_mlflow_run_id=self.parent_mlflow_run_id, stopped_by=stopped_by or "max_trials",
        )
        complete = [t for t in result.trials if t.state == "COMPLETE" and t.value is not None]
        if complete:
            pick = max if self.sweep.objective.direction == "maximize" else min
            result.best = pick(complete, key=lambda t: t.value)  # type: ignore[arg-type, return-value]
            result.best_spec = self.sweep.trial_spec(result.best.params, result.best.number).model_dump(mode="json")
        return result
