"""A job outlives the Dagster run that followed it (its process SIGKILLed, as the OOM killer would): the preemption
sensor marks that run failed and has a new run of the partition take the job over, which follows it to its end and
materializes the run without training it a second time. While the first run is still there, nobody else may."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import dagster as dg
import pytest

from tests.fixtures.materialize import (
    failure_requests,
    materialize_in_subprocess,
    materialize_partition,
    preemption_requests,
    step_failure_message,
)
from tests.fixtures.worker import wait_until
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import read_result, register_run
from training_platform.spec import parse_spec
from training_platform.spec.submission import FOLLOW_TAG, LEFT_JOB_TAG, PARTITION_TAG

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
SELECTION = ["training_run", "checkpoints"]


def _job_training(run_dir: Path) -> int | None:
    """The local job's pid (its process group) once it is past step 20."""
    events = RunEvents(run_dir).read()
    submitted = [e for e in events if e["kind"] == "submitted"]
    if submitted and any(e["kind"] == "progress" and e["step"] >= 20 for e in events):
        return int(submitted[-1]["job_id"].split(":")[0])
    return None


def test_a_job_whose_dagster_run_died_is_taken_over_and_materialized_without_training_again(instance, tmp_path):
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    spec = parse_spec(
        {
            "name": "orphan",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": 300, "batch_size": 16, "eval_every": 100, "log_every": 5},
            "checkpoint": {"every_steps": 100, "keep_last": 10},
            "preemption": {"retry_failures": 1},  # the failure sensor would retry, and must not here
        }
    )
    run_id = register_run(home, spec, "orphan")
    instance.add_dynamic_partitions("training_runs", [run_id])
    run_dir = home.run_dir(run_id)

    # The first Dagster run, in a process of its own; its job is paused past step 20 so that the checks below
    # happen while it still trains, whatever this machine's pace.
    first = materialize_in_subprocess(run_id, SELECTION, tmp_path / "first-run.log")
    job_pid = None
    try:
        job_pid = wait_until(lambda: _job_training(run_dir), 180, "the job to pass step 20")
        os.killpg(job_pid, signal.SIGSTOP)
        (first_run,) = instance.get_runs(dg.RunsFilter(tags={PARTITION_TAG: run_id}))

        # While its follower is there, another run of the partition is refused, and is not retried.
        refused = materialize_partition(instance, run_id, SELECTION)
        assert not refused.success
        message = step_failure_message(refused)
        assert first_run.run_id in message and "still in progress" in message
        assert failure_requests(instance, refused) == []
        assert preemption_requests(instance) == []  # nobody takes over a job that is followed

        first.kill()  # the OOM killer's pick: no handler runs
        first.wait(timeout=60)
        assert instance.get_run_by_id(first_run.run_id).status == dg.DagsterRunStatus.STARTED  # nobody told Dagster

        (request,) = preemption_requests(instance)
        went_down = instance.get_run_by_id(first_run.run_id)
        assert went_down.status == dg.DagsterRunStatus.FAILURE
        assert went_down.tags[LEFT_JOB_TAG] == f"{job_pid}:{run_dir}"  # `tp` waits for the run taking over
        assert request.partition_key == run_id and request.tags[FOLLOW_TAG] == first_run.run_id
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if job_pid is not None:
            os.killpg(job_pid, signal.SIGCONT)

    taken = materialize_partition(instance, run_id, SELECTION, tags=request.tags)
    assert taken.success, (tmp_path / "first-run.log").read_text()[-3000:]
    events = RunEvents(run_dir).read()
    (submitted,) = [e for e in events if e["kind"] == "submitted"]  # trained once
    (followed,) = [e for e in events if e["kind"] == "followed"]
    assert followed["dagster_run_id"] == taken.run_id and followed["job_id"] == submitted["job_id"]
    assert not [e for e in events if e["kind"] == "resumed"]  # never restarted
    assert [e["state"] for e in events if e["kind"] == "job_ended"] == ["SUCCEEDED"]
    result = read_result(home, run_id)
    assert result["final_step"] == 300
    metadata = taken.asset_materializations_for_node("training_run")[0].metadata
    assert metadata["final_weights_sha256"].value == result["final_weights_sha256"]
    assert metadata["mlflow_run_id"].value == submitted["mlflow_run_id"]  # the MLflow run the job logged to
    assert preemption_requests(instance) == []  # followed to its end: nothing left to take over
