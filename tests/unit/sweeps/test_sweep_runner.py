"""The sweep runner against real Optuna storage: trials, pruning through the worker-side protocol, restarts.

The stand-in trial does what the worker does for a sweep (TrialPruning from the run's TrialContext,
report each validation, stop when pruned) on a synthetic learning curve, without torch.
"""

import json
import math
from datetime import UTC, datetime, timedelta

import optuna
import pytest

from training_platform.errors import SpecError
from training_platform.paths import PlatformHome
from training_platform.sweeps import SweepDriver, TrialContext, parse_sweep, run_sweep
from training_platform.sweeps.driver import RunState, TrialRun
from training_platform.sweeps.trial import TrialPruning

BASE = {"name": "digits", "team": "vision", "owner": "me", "training": {"max_steps": 90, "eval_every": 10}}


def sweep_data(**over):
    data = {
        "name": "lr-sweep",
        "base": BASE,
        "search_space": {"training.learning_rate": {"type": "float", "low": 1e-4, "high": 1.0, "log": True}},
        "sampler": {"type": "random", "seed": 1},
        "pruner": {"type": "asha", "min_resource": 10, "reduction_factor": 3},
        "limits": {"max_trials": 12, "parallel_trials": 1},
    }
    data.update(over)
    return data


def curve_trial(home: PlatformHome):
    """Accuracy rises with steps; the best learning rate is 0.01 (log-distance sets the ceiling)."""

    def run(spec, run_id):
        run_dir = home.run_dir(run_id)
        pruning = TrialPruning(TrialContext.read(home, run_id))
        lr, status, step = spec.training.learning_rate, "SUCCEEDED", 0
        ceiling = 1.0 - 0.15 * abs(math.log10(lr) + 2)
        for step in range(10, spec.training.max_steps + 1, 10):
            accuracy = ceiling * (1 - math.exp(-step / 30))
            if pruning.report(step, {"val_accuracy": accuracy}):
                status = "PRUNED"
                break
        result = {"status": status, "final_step": step, "metrics": {"val_accuracy": accuracy}, "train_seconds": 1.0}
        (run_dir / "result.json").write_text(json.dumps(result))

    return run


def test_asha_sweep_prunes_and_reports_the_best_spec(tmp_path):
    home = PlatformHome(tmp_path).ensure()
    sweep = parse_sweep(sweep_data())
    result = run_sweep(sweep, home, curve_trial(home))
    counts = result.counts()
    assert len(result.trials) == 12 and counts["FAIL"] == 0
    assert counts["PRUNED"] >= 3, counts
    assert result.total_steps < 12 * 90
    study = optuna.load_study(study_name="lr-sweep", storage=result.storage)
    states = {t.user_attrs["run_id"]: t.state.name for t in study.trials}
    assert states == {t.run_id: t.state for t in result.trials}
    best = max((t for t in result.trials if t.state == "COMPLETE"), key=lambda t: t.value)
    assert result.best.number == best.number
    assert result.best_spec["training"]["learning_rate"] == best.params["training.learning_rate"]
    assert result.best_spec["training"]["max_steps"] == 90 and result.best_spec["team"] == "vision"


def test_restarted_sweep_counts_finished_trials_and_fails_orphans(tmp_path):
    home = PlatformHome(tmp_path).ensure()
    sweep = parse_sweep(sweep_data(limits={"max_trials": 4}))
    run_sweep(sweep, home, curve_trial(home))
    study = optuna.load_study(study_name="lr-sweep", storage=f"sqlite:///{tmp_path / 'sweeps.db'}")
    orphan = study.ask()  # an orchestrator died while this trial ran
    more = parse_sweep(sweep_data(limits={"max_trials": 6}))
    result = run_sweep(more, home, curve_trial(home))
    assert len(result.trials) == 6
    assert study.trials[orphan.number].state == optuna.trial.TrialState.FAIL


def test_failed_trial_is_recorded_and_the_sweep_goes_on(tmp_path):
    home = PlatformHome(tmp_path).ensure()

    def flaky(spec, run_id):
        if spec.training.learning_rate > 0.01:
            raise RuntimeError("worker crashed")
        return curve_trial(home)(spec, run_id)

    result = run_sweep(parse_sweep(sweep_data(limits={"max_trials": 5})), home, flaky)
    assert any(t.state == "FAIL" and "worker crashed" in t.error for t in result.trials)
    assert sum(t.state in ("COMPLETE", "PRUNED") for t in result.trials) == 5


def test_bad_sweep_specs_name_the_field_and_fix():
    with pytest.raises(SpecError, match="'learning_rat' is not a TrainSpec field"):
        parse_sweep(sweep_data(search_space={"training.learning_rat": {"type": "float", "low": 0.1, "high": 1}}))
    with pytest.raises(SpecError, match="needs `step`"):
        parse_sweep(sweep_data(sampler={"type": "grid"}))
    with pytest.raises(SpecError, match="base: resources.gpus_per_node"):
        parse_sweep(sweep_data(base={**BASE, "resources": {"gpus_per_node": -1}}))


def test_grid_sampler_covers_the_grid(tmp_path):
    home = PlatformHome(tmp_path).ensure()
    space = {"training.batch_size": {"type": "categorical", "choices": [16, 32]},
             "training.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "step": 0.0495}}
    sweep = parse_sweep(sweep_data(search_space=space, sampler={"type": "grid"}, pruner={"type": "none"},
                                   limits={"max_trials": 6, "parallel_trials": 2}))
    result = run_sweep(sweep, home, curve_trial(home))
    seen = {(t.params["training.batch_size"], round(t.params["training.learning_rate"], 4)) for t in result.trials}
    assert seen == {(b, lr) for b in (16, 32) for lr in (0.001, 0.0505, 0.1)}


@pytest.mark.parametrize("pruner", [
    {"type": "hyperband", "min_resource": 10, "max_resource": 90, "reduction_factor": 3},
    {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 10},
])
def test_hyperband_and_median_prune_through_the_worker_protocol(tmp_path, pruner):
    home = PlatformHome(tmp_path).ensure()
    result = run_sweep(parse_sweep(sweep_data(pruner=pruner, limits={"max_trials": 10})), home, curve_trial(home))
    assert len(result.trials) == 10 and result.counts()["PRUNED"] >= 2, result.counts()
    assert result.best is not None


def test_no_trial_is_released_after_the_sweeps_cost_window_ends(tmp_path):
    home = PlatformHome(tmp_path).ensure()
    sweep = parse_sweep(sweep_data(limits={"max_trials": 4, "parallel_trials": 2}))
    now = datetime.now(UTC)
    unknown = lambda run_id: RunState(TrialRun.UNKNOWN)  # noqa: E731

    SweepDriver.start(sweep, home)
    open_window = SweepDriver(sweep, home, trials_until=now + timedelta(hours=1)).step(unknown)
    assert len(open_window.launch) == 2 and open_window.result is None

    closed = SweepDriver(sweep, home, trials_until=now - timedelta(seconds=1)).step(
        lambda run_id: RunState(TrialRun.FINISHED)
    )
    assert closed.launch == [] and closed.result is not None
    assert closed.result.stopped_by == "window_closed" and len(closed.result.trials) == 2


def test_a_study_databases_password_stays_in_the_environment():
    """The storage URL every record carries hides its password; a trial's worker takes it from TP_SWEEP_STORAGE."""
    from training_platform.errors import PlatformError
    from training_platform.sweeps.study import private_url, public_url

    url = "postgresql+psycopg2://tp:s3cret-pass@127.0.0.1:5432/optuna"
    public = public_url(url)
    assert "s3cret-pass" not in public and public.startswith("postgresql+psycopg2://tp:")
    assert private_url(public, {"TP_SWEEP_STORAGE": url}) == url
    assert private_url("sqlite:////tmp/sweeps.db", {}) == "sqlite:////tmp/sweeps.db"  # no password: as it is
    with pytest.raises(PlatformError, match="set TP_SWEEP_STORAGE"):
        private_url(public, {"TP_SWEEP_STORAGE": "postgresql+psycopg2://tp:other@127.0.0.1:5432/elsewhere"})
    with pytest.raises(SpecError, match="storage.*password.*TP_SWEEP_STORAGE"):
        parse_sweep(sweep_data(storage=url))
