"""The same `training_run` asset on real Slurm: parity with local, and two real spot preemptions."""

import json
import threading
import time

import dagster as dg
import pytest

from assets import ALL_ASSETS
from definitions import defs
from sensors.preemption import preemption_sensor
from tests.fixtures.worker import wait_until
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runlog import RunEvents
from training_platform.runs import read_result, register_run
from training_platform.spec import parse_spec

SLURM_WAIT_SECONDS = 240  # a preemption and requeue through slurmctld's scheduling cycle

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def instance(tmp_path, monkeypatch, slurm_cluster):
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.slurm_conf)
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.get() as instance:
        yield instance


def _materialize(instance, run_id: str, backend: str):
    return dg.materialize(
        ALL_ASSETS,
        selection=["training_run", "checkpoints"],
        partition_key=run_id,
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
        run_config={"ops": {"training_run": {"config": {"backend": backend}}}},
    )


def _count(events: RunEvents, kind: str) -> int:
    return sum(1 for e in events.read() if e["kind"] == kind)


def _preempt_and_release(cluster, events: RunEvents, job_id: str, number: int) -> None:
    """An on-demand job needs the spot run's CPUs; once Slurm requeued the run, let it start again at once
    (Slurm holds requeued jobs back two minutes, Reason=BeginTime)."""
    cluster.run("sbatch", "--parsable", "--partition=ondemand", "--ntasks=1", "--output=/dev/null", "--wrap=sleep 1")
    wait_until(lambda: _count(events, "preempted") >= number, SLURM_WAIT_SECONDS, f"preemption {number}")
    deadline = time.monotonic() + 120
    while _count(events, "started") <= number and time.monotonic() < deadline:
        job = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        if "JobState=PENDING" in job and "Reason=BeginTime" in job:
            cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        time.sleep(0.3)
    wait_until(
        lambda: _count(events, "first_step") > number, SLURM_WAIT_SECONDS, f"resume after preemption {number}"
    )


def test_training_run_on_slurm_survives_two_preemptions_and_matches_local(instance, slurm_cluster):
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    spec = parse_spec(
        {
            "name": "spot-slurm",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "resources": {"procs_per_node": 2, "spot": True},
            "training": {"max_steps": 3000, "batch_size": 16, "eval_every": 500, "log_every": 20},
            "checkpoint": {"every_steps": 500, "keep_last": 10, "grace_period_seconds": 20},
        }
    )
    for run_id in ("on-local", "on-slurm"):
        register_run(home, spec, run_id)
    instance.add_dynamic_partitions("training_runs", ["on-local", "on-slurm"])
    assert _materialize(instance, "on-local", "local").success
    expected = read_result(home, "on-local")["final_weights_sha256"]

    box = {}
    worker = threading.Thread(target=lambda: box.update(result=_materialize(instance, "on-slurm", "slurm")))
    worker.start()
    events = RunEvents(home.run_dir("on-slurm"))
    wait_until(lambda: _count(events, "first_step") >= 1, SLURM_WAIT_SECONDS, "the Slurm job to start training")
    job_id = next(e["job_id"] for e in events.read() if e["kind"] == "submitted")
    for number in (1, 2):
        _preempt_and_release(slurm_cluster, events, job_id, number)
    worker.join(timeout=600)

    result = box["result"]
    assert result.success
    trained = read_result(home, "on-slurm")
    assert trained["world_size"] == 2
    assert trained["final_weights_sha256"] == expected
    metadata = result.asset_materializations_for_node("training_run")[0].metadata
    assert metadata["preemptions"].value == 2
    assert metadata["lost_steps"].value == 0
    assert [i["lost_steps"] for i in json.loads(json.dumps(metadata["interruptions"].value))] == [0, 0]

    context = dg.build_sensor_context(instance=instance, resources=defs.resources, definitions=defs)
    requests = list(preemption_sensor(context) or [])
    assert not [r for r in requests if isinstance(r, dg.RunRequest)]  # the engine requeued: nothing to resubmit
    observed = [
        r.asset_observation
        for r in instance.fetch_observations(dg.AssetKey("training_run"), limit=10).records
        if r.asset_observation.partition == "on-slurm"
    ]
    assert sorted(o.metadata["lost_steps"].value for o in observed) == [0, 0]
    assert all(o.metadata["engine"].value == "slurm" for o in observed)
