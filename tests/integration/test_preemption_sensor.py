"""A real preemption through Dagster: SIGTERM mid-run, the sensor resumes it, the weights are exact."""

import os
import signal
import threading
import time

import dagster as dg
import pytest

from definitions import defs
from sensors.preemption import preemption_sensor
from tests.fixtures.materialize import materialize_partition
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import read_result, register_run
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]
SELECTION = ["training_run", "checkpoints"]


def _spec(home: PlatformHome):
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    return parse_spec(
        {
            "name": "spot-run",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": 300, "batch_size": 16, "eval_every": 100, "log_every": 5},
            "checkpoint": {"every_steps": 100, "keep_last": 10},
            "resources": {"spot": True},
        }
    )


def _materialize(instance, run_id, run_config=None):
    return materialize_partition(instance, run_id, SELECTION, run_config)


def _job_pid(run_dir, timeout=120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = RunEvents(run_dir).read()
        submitted = [e for e in events if e["kind"] == "submitted"]
        if submitted and any(e["kind"] == "progress" and e["step"] >= 20 for e in events):
            return int(submitted[-1]["job_id"].split(":")[0])
        time.sleep(0.1)
    raise TimeoutError("the job never reached step 20")


def _tick(instance, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources, definitions=defs)
    result = preemption_sensor(context)
    requests = list(result) if result is not None else []
    return requests, context.cursor


def test_preempted_run_is_resumed_by_the_sensor_and_ends_bitwise_equal(instance):
    home = PlatformHome.from_env().ensure()
    spec = _spec(home)

    straight = register_run(home, spec, "straight")
    instance.add_dynamic_partitions("training_runs", [straight, "preempted"])
    assert _materialize(instance, straight).success
    expected = read_result(home, straight)["final_weights_sha256"]

    run_id = register_run(home, spec, "preempted")
    box = {}
    worker = threading.Thread(target=lambda: box.update(result=_materialize(instance, run_id)))
    worker.start()
    os.killpg(_job_pid(home.run_dir(run_id)), signal.SIGTERM)
    worker.join(timeout=180)
    first = box["result"]
    assert not first.success
    failure = next(e for e in first.all_events if e.is_step_failure)
    assert "preempted" in failure.step_failure_data.error.message

    requests, cursor = _tick(instance)
    (request,) = [r for r in requests if isinstance(r, dg.RunRequest)]
    assert request.partition_key == run_id
    assert request.tags["tp/resume_of"] == first.run_id  # the Dagster run whose job was preempted

    resumed = _materialize(instance, run_id, request.run_config)
    assert resumed.success
    result = read_result(home, run_id)
    assert 0 < result["resumed_from_step"] < 300
    assert result["final_weights_sha256"] == expected

    metadata = resumed.asset_materializations_for_node("training_run")[0].metadata
    assert metadata["preemptions"].value == 1
    assert metadata["lost_steps"].value == 0
    assert metadata["recovery_seconds_median"].value > 0

    # The finished run is no longer followed: no new request; the preemption was recorded as an observation.
    requests, _ = _tick(instance, cursor)
    assert not [r for r in requests if isinstance(r, dg.RunRequest)]
    records = instance.fetch_observations(dg.AssetKey("training_run"), limit=10).records
    observed = [r.asset_observation for r in records if r.asset_observation.partition == run_id]
    assert observed and observed[0].metadata["lost_steps"].value == 0
