"""A cross-team spec is refused at validation by every entry point: `tp train` and `tp render` (exit 2,
one line, nothing submitted) and the training_run asset (the UI, sensors and sweeps launch through it)."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.fixtures.materialize import materialize_partition, step_failure_message
from training_platform.paths import PlatformHome
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec

pytestmark = pytest.mark.integration
TP = str(Path(sys.executable).with_name("tp"))
CROSS_TEAM = {
    "name": "sneaky",
    "team": "vision",
    "owner": "ada",
    "backend": "k8s",
    "dataset": {"snapshot_id": "0" * 64},
    "kubernetes": {"namespace": "nlp", "secret_refs": ["nlp-s3-credentials"]},
}


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    teams = {"teams": {"vision": {}, "nlp": {"kubernetes": {"secrets": ["nlp-s3-credentials"]}}}}
    (tmp_path / "teams.yaml").write_text(yaml.safe_dump(teams))
    monkeypatch.setenv("TP_TEAMS", str(tmp_path / "teams.yaml"))
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    return PlatformHome.from_env().ensure()


@pytest.mark.parametrize("command", ["train", "render"])
def test_tp_refuses_a_cross_team_spec_in_one_line_with_exit_2(home, tmp_path, command):
    spec = tmp_path / "sneaky.yaml"
    spec.write_text(yaml.safe_dump(CROSS_TEAM))
    done = subprocess.run([TP, command, str(spec)], env=os.environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: kubernetes.namespace: 'nlp' is not team 'vision''s")
    assert "nlp-s3-credentials" not in done.stdout  # nothing rendered
    assert not any(home.runs.iterdir())


def test_the_training_asset_refuses_a_cross_team_spec(home):
    register_run(home, parse_spec(CROSS_TEAM), "sneaky-1")
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("training_runs", ["sneaky-1"])
        result = materialize_partition(instance, "sneaky-1")
    assert not result.success
    assert "kubernetes.namespace: 'nlp' is not team 'vision''s" in step_failure_message(result)
    launched = {"spec.json", "pipes-messages.jsonl", "worker.log", "events.jsonl"}  # what a launch writes
    assert not launched & {p.name for p in home.run_dir("sneaky-1").iterdir()}
