"""A job that shares no disk with the Dagster side, as a Kubernetes pod without a shared home: its result, event
log and Pipes messages reach the `training_run` asset through the run store, a bucket on a real S3 server.

The job runs on this machine (the local launcher, torchrun), in a run directory of its own that the Dagster side
never reads: what the asset reports can only have come through the bucket.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from resources.launcher import LauncherResource
from tests.fixtures.materialize import materialize_partition
from training_platform.checkpoints.backends import open_storage
from training_platform.datasets import build_snapshot
from training_platform.launch import RunRequest
from training_platform.launch.local import LocalLauncher
from training_platform.paths import RUN_STORE_ENV, PlatformHome
from training_platform.runs.events import RunEvents
from training_platform.runs.remote_files import PIPES_MESSAGES_FILE
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


class PodOnThisMachine(LocalLauncher):
    """The local launcher with the job's run directory apart from the Dagster side's, as a pod's is."""

    def __init__(self, pods: Path, store_uri: str):
        super().__init__(visible_gpus=0)
        self.pods, self.store_uri = pods, store_uri

    @property
    def run_store(self):
        return open_storage(self.store_uri)

    def plan(self, request: RunRequest):
        pod_dir = self.pods / request.run_id
        pod_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(request.spec_path, pod_dir / "spec.json")  # as the Job's ConfigMap carries it
        return super().plan(replace(request, run_dir=pod_dir, env={**request.env, RUN_STORE_ENV: self.store_uri}))


def test_a_jobs_result_events_and_pipes_messages_reach_the_asset_through_the_bucket(
    instance, s3_server, s3_bucket, tmp_path, monkeypatch
):
    pods = tmp_path / "pods"
    launcher = PodOnThisMachine(pods, f"s3://{s3_bucket}/runs")
    monkeypatch.setattr(LauncherResource, "launcher_for", lambda self, backend: launcher)
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    spec = parse_spec({
        "name": "pod-like", "team": "qa", "owner": "ci", "dataset": {"snapshot_id": snapshot},
        "training": {"max_steps": 60, "batch_size": 16, "eval_every": 30, "log_every": 10},
        "resources": {"procs_per_node": 1},
        "checkpoint": {"every_steps": 30},
    })
    run_id = register_run(home, spec, "pod-like")
    instance.add_dynamic_partitions("training_runs", [run_id])

    result = materialize_partition(instance, run_id)

    pod_dir, run_dir = pods / run_id, home.run_dir(run_id)
    assert result.success, (pod_dir / "worker.log").read_text()[-3000:]
    # The job wrote into its own directory only; the Dagster side's copy came through the bucket.
    assert json.loads((run_dir / "result.json").read_text()) == json.loads((pod_dir / "result.json").read_text())
    assert (pod_dir / PIPES_MESSAGES_FILE).is_file() and (run_dir / PIPES_MESSAGES_FILE).is_file()
    kinds = [e["kind"] for e in RunEvents(run_dir).read()]
    assert kinds[0] == "submitted" and kinds[-1] == "job_ended"  # the Dagster side's own, around the job's
    assert {"started", "progress", "checkpoint", "finished"} <= set(kinds)
    job_events = RunEvents(pod_dir).read()
    pulled = [e for e in RunEvents(run_dir).read() if e["kind"] not in ("submitted", "job_running", "job_ended")]
    assert pulled == job_events  # every line once, in the job's order
    # What the worker reported over Pipes is on the materialization: the messages file came through too.
    metadata = result.asset_materializations_for_node("training_run")[0].metadata
    assert metadata["final_step"].value == 60
    assert metadata["status"].value == "SUCCEEDED"
    logged = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("finished at step 60" in message for message in logged)
