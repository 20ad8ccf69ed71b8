"""The alert sensor keeps each firing alert of a run as a tag on its Dagster run (a real instance)."""

import dagster as dg
import pytest

from sensors.alerts import ALERT_TAG_PREFIX, keep_tags
from training_platform.telemetry.alerts import Alert
from training_platform.telemetry.records import RunRecord

IDLE = Alert("low_utilization", "run-7", "CPU utilization averaged 20% over 2 s", "the data loader", 20.0, 50.0)
TEAM = Alert("failure_rate", "", "2 of its 3 runs failed", "the failures", 0.67, 0.5, team="qa", period="2026-11-28")
TAG = f"{ALERT_TAG_PREFIX}low_utilization"


@dg.asset
def trained() -> int:
    return 1


@pytest.fixture
def instance_and_run():
    with dg.instance_for_test() as instance:
        run_id = dg.materialize([trained], instance=instance).run_id
        yield instance, run_id, [RunRecord(run_id="run-7", status="RUNNING", extra={"dagster_run_id": run_id})]


def test_a_firing_alert_is_tagged_once_and_team_rules_tag_no_run(instance_and_run, monkeypatch):
    instance, run_id, records = instance_and_run
    writes = []
    add_run_tags = instance.add_run_tags
    monkeypatch.setattr(instance, "add_run_tags", lambda rid, tags: (writes.append(tags), add_run_tags(rid, tags)))
    keep_tags(instance, [IDLE, TEAM], records)
    assert instance.get_run_by_id(run_id).tags[TAG] == IDLE.text()
    keep_tags(instance, [IDLE, TEAM], records)
    assert writes == [{TAG: IDLE.text()}], "a tag already shown is not written again; a team rule tags no run"


def test_a_tag_written_over_by_the_runs_own_progress_is_put_back(instance_and_run, monkeypatch):
    """Dagster's add_run_tags reads the run, merges, writes it back: the run publishing its step while
    the sensor tags it can drop the alert's tag. The next tick puts it back."""
    instance, run_id, records = instance_and_run
    before_the_alert = instance.get_run_by_id(run_id)
    keep_tags(instance, [IDLE], records)
    storage = instance.run_storage
    monkeypatch.setattr(storage, "_get_run_by_id", lambda rid: before_the_alert, raising=False)
    instance.add_run_tags(run_id, {"tp/step": "40"})  # the progress write that read the run first
    monkeypatch.undo()
    assert TAG not in instance.get_run_by_id(run_id).tags, "the lost update this guards against"
    keep_tags(instance, [IDLE], records)
    tags = instance.get_run_by_id(run_id).tags
    assert tags[TAG] == IDLE.text() and tags["tp/step"] == "40"
