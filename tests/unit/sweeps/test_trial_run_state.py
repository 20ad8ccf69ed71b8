"""A trial whose Dagster run went down while its job went on is still running (a run takes the job over); one
that failed for good is failed."""

from __future__ import annotations

import dagster as dg

from sensors.sweeps import trial_run_state
from training_platform.paths import PlatformHome
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec
from training_platform.spec.submission import LEFT_JOB_TAG, PARTITION_TAG
from training_platform.sweeps.driver import TrialRun


@dg.op
def _goes_down() -> None:
    raise RuntimeError("the run's process is gone")


@dg.job
def _trial_job() -> None:
    _goes_down()


def _failed_run(instance: dg.DagsterInstance, run_id: str, **tags: str) -> None:
    tags = {PARTITION_TAG: run_id, **tags}
    result = _trial_job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
    assert not result.success


def test_a_trial_whose_job_goes_on_is_running_and_one_that_failed_is_failed(tmp_path):
    home = PlatformHome(tmp_path / "home").ensure()
    spec = parse_spec({"name": "trial", "team": "qa", "owner": "ci"})
    with dg.DagsterInstance.ephemeral() as instance:
        left = register_run(home, spec, "trial-left")
        _failed_run(instance, left, **{LEFT_JOB_TAG: "123"})
        assert trial_run_state(instance, home, left).state == TrialRun.RUNNING

        failed = register_run(home, spec, "trial-failed")
        _failed_run(instance, failed)
        assert trial_run_state(instance, home, failed).state == TrialRun.FAILED
