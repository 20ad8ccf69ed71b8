"""Run a whole sweep in this process: step the driver, run each trial with a function, until it is over.

The platform's sweeps are driven by the server (a sensor steps the driver and submits each trial as a
queued training run). This loop is for what has no server: benchmarks and tests that run trials with
a plain function `run_trial(spec, run_id)` (it raises, or leaves the trial's result in its run directory).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from training_platform.paths import PlatformHome
from training_platform.spec import TrainSpec
from training_platform.sweeps.driver import RunState, SweepDriver, SweepResult, TrialOutcome, TrialRun
from training_platform.sweeps.spec import SweepSpec

TrialRunner = Callable[[TrainSpec, str], Any]


def run_sweep(
    sweep: SweepSpec,
    home: PlatformHome,
    run_trial: TrialRunner,
    *,
    parent_mlflow_run_id: str | None = None,
    on_trial: Callable[[TrialOutcome], None] | None = None,
) -> SweepResult:
    """Run trials until max_trials (counting those a previous attempt finished), a cost limit, or the deadline."""
    driver = SweepDriver.start(sweep, home, parent_mlflow_run_id)
    futures: dict[str, Future] = {}

    def run_state(run_id: str) -> RunState:
        future = futures.get(run_id)
        if future is None:
            return RunState(TrialRun.UNKNOWN)
        if not future.done():
            return RunState(TrialRun.RUNNING)
        error = future.exception()
        return RunState(TrialRun.FAILED, f"{type(error).__name__}: {error}") if error else RunState(TrialRun.FINISHED)

    with ThreadPoolExecutor(max_workers=sweep.limits.parallel_trials, thread_name_prefix="trial") as pool:
        while True:
            step = driver.step(run_state)
            for outcome in step.told:
                if on_trial is not None:
                    on_trial(outcome)
            for launch in step.launch:
                futures[launch.run_id] = pool.submit(run_trial, launch.spec, launch.run_id)
            if step.result is not None:
                return step.result
            wait([f for f in futures.values() if not f.done()], return_when=FIRST_COMPLETED)
