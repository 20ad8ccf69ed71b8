"""On real Slurm: the Dagster run following a job is SIGKILLed (the OOM killer's pick) while the job trains on to
its end. The preemption sensor has a new run take the finished job over, which materializes the run from the job's
result without training it again."""

import dagster as dg
import pytest

from tests.fixtures.materialize import materialize_in_subprocess, materialize_partition, preemption_requests
from tests.fixtures.worker import wait_until
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.following import newest_job
from training_platform.launch.slurm import SlurmLauncher
from training_platform.paths import PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import read_result, register_run
from training_platform.spec import parse_spec
from training_platform.spec.submission import FOLLOW_TAG, LEFT_JOB_TAG

SLURM_WAIT_SECONDS = 240
SELECTION = ["training_run", "checkpoints"]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("slurm_conf"),  # with the `instance` fixture: the run's home and Dagster, on the cluster
]


def test_a_slurm_job_that_finished_after_its_dagster_run_died_is_materialized_by_a_run_taking_it_over(
    instance, tmp_path
):
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    spec = parse_spec(
        {
            "name": "orphan-slurm",
            "team": "qa",
            "owner": "ci",
            "backend": "slurm",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": 600, "batch_size": 16, "eval_every": 200, "log_every": 20},
            "checkpoint": {"every_steps": 200, "keep_last": 10},
        }
    )
    run_id = register_run(home, spec, "orphan-slurm")
    instance.add_dynamic_partitions("training_runs", [run_id])
    run_dir = home.run_dir(run_id)
    events = RunEvents(run_dir)

    first = materialize_in_subprocess(run_id, SELECTION, tmp_path / "first-run.log")
    try:
        wait_until(lambda: any(e["kind"] == "first_step" for e in events.read()), SLURM_WAIT_SECONDS, "training")
    finally:
        first.kill()  # no handler runs: the Slurm job is neither cancelled nor followed any more
        first.wait(timeout=60)
    job = newest_job(run_id, events.read()).handle
    launcher = SlurmLauncher()
    wait_until(lambda: launcher.status(job).state.finished, SLURM_WAIT_SECONDS, "the job to finish", poll=1.0)
    assert launcher.status(job).state == JobState.SUCCEEDED

    (request,) = preemption_requests(instance)
    assert request.partition_key == run_id
    went_down = instance.get_run_by_id(request.tags[FOLLOW_TAG])
    assert went_down.status == dg.DagsterRunStatus.FAILURE and went_down.tags[LEFT_JOB_TAG] == job.job_id

    taken = materialize_partition(instance, run_id, SELECTION, tags=request.tags)
    assert taken.success
    log = events.read()
    assert [e["kind"] for e in log].count("submitted") == 1  # trained once
    assert [e["state"] for e in log if e["kind"] == "job_ended"] == ["SUCCEEDED"]
    result = read_result(home, run_id)
    assert result["final_step"] == 600
    metadata = taken.asset_materializations_for_node("training_run")[0].metadata
    assert metadata["final_weights_sha256"].value == result["final_weights_sha256"]
    assert preemption_requests(instance) == []
