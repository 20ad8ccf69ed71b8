"""The same `training_run` asset on real Slurm: parity with local, and two real spot preemptions, each
released from Slurm's requeue hold by the platform, the second moving the run to on-demand."""

import json
import re
import threading

import dagster as dg
import pytest

from assets import ALL_ASSETS
from definitions import defs
from sensors.preemption import preemption_sensor
from tests.fixtures.worker import wait_until
from tests.integration.server.runs import paced_entrypoint
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import read_result, register_run
from training_platform.spec import parse_spec

SLURM_WAIT_SECONDS = 240  # a preemption and requeue through slurmctld's scheduling cycle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("slurm_conf"),  # with the `instance` fixture: the run's home and Dagster, on the cluster
]


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


def _preempt(cluster, events: RunEvents, number: int) -> None:
    """An on-demand job needs the spot run's CPUs; returns once the run trains again."""
    cluster.run("sbatch", "--parsable", "--partition=ondemand", "--ntasks=1", "--output=/dev/null", "--wrap=sleep 1")
    wait_until(lambda: _count(events, "preempted") >= number, SLURM_WAIT_SECONDS, f"preemption {number}")
    wait_until(lambda: _count(events, "first_step") > number, SLURM_WAIT_SECONDS, f"resume after preemption {number}")


def _released_each_requeue(instance, run_id: str, events: RunEvents) -> None:
    """Slurm holds a requeued job back (Reason=BeginTime; 80 s on the test cluster, 120 s by default): for each
    preemption the platform, having seen the emergency checkpoint, released that hold before the next attempt
    started. What it did, not how long it took: on a loaded machine the attempt's own start varies."""
    released = [
        entry.timestamp
        for entry in instance.all_logs(run_id)
        if "checkpointed cleanly, requeue hold released" in entry.user_message
    ]
    history = events.read()
    preempted = [e["at"] for e in history if e["kind"] == "preempted"]
    restarted = [e["at"] for e in history if e["kind"] == "started"][1:]
    assert len(preempted) == 2 and len(restarted) == 2, history
    for number, (checkpointed, started) in enumerate(zip(preempted, restarted, strict=True), start=1):
        assert any(checkpointed < at < started for at in released), (
            f"preemption {number}: no hold released between its checkpoint ({checkpointed}) and the next start "
            f"({started}); releases at {released}"
        )


def test_training_run_on_slurm_survives_two_preemptions_and_matches_local(instance, slurm_cluster, tmp_path):
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    # Paced by the clock (20 ms a step) while the pace file exists: the Slurm run lasts through both preemptions
    # however busy the machine, at little CPU; the local reference, and the Slurm run once both preemptions are
    # seen, train at full speed (the pace changes no weight).
    pace = tmp_path / "paced"
    spec = parse_spec(
        {
            "name": "spot-slurm",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "resources": {"procs_per_node": 2, "spot": True},
            "training": {"max_steps": 3000, "batch_size": 16, "eval_every": 500, "log_every": 20},
            "checkpoint": {"every_steps": 500, "keep_last": 10, "grace_period_seconds": 20},
            "preemption": {"fallback_to_ondemand_after": 2},
            "entrypoint": paced_entrypoint(pace, step_seconds=0.02),
        }
    )
    for run_id in ("on-local", "on-slurm"):
        register_run(home, spec, run_id)
    instance.add_dynamic_partitions("training_runs", ["on-local", "on-slurm"])
    assert _materialize(instance, "on-local", "local").success
    expected = read_result(home, "on-local")["final_weights_sha256"]
    pace.touch()

    box = {}
    worker = threading.Thread(target=lambda: box.update(result=_materialize(instance, "on-slurm", "slurm")))
    worker.start()
    events = RunEvents(home.run_dir("on-slurm"))
    wait_until(lambda: _count(events, "first_step") >= 1, SLURM_WAIT_SECONDS, "the Slurm job to start training")
    for number in (1, 2):
        _preempt(slurm_cluster, events, number)
    pace.unlink()
    worker.join(timeout=600)
    # After the second preemption (preemption.fallback_to_ondemand_after), the requeued job moved to on-demand.
    (moved,) = [e for e in events.read() if e["kind"] == "moved_to_on_demand"]
    assert "2 preemptions on spot" in moved["reason"]
    job = slurm_cluster.run("scontrol", "show", "job", "-o", moved["job_id"]).stdout
    assert "Partition=ondemand" in job, job
    # The job's comment names a durable checkpoint of the run (each new one was published while it ran).
    published = re.search(r"Comment=tp-checkpoint:step=(\d+);saved_at=\d{4}-\d\d-\d\dT[\d:]+Z", job)
    assert published, job
    assert int(published.group(1)) in {e["step"] for e in events.read() if e["kind"] == "checkpoint"}

    result = box["result"]
    assert result.success
    # How soon a released job restarts is a figure of benchmarks/preemption.py --backend slurm.
    _released_each_requeue(instance, result.run_id, events)
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
