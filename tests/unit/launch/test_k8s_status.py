"""Job/Workload/Pod conditions -> JobStatus, on API objects of each phase of a run's life."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from training_platform.launch.base import JobState
from training_platform.launch.k8s_status import job_status

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "k8s_recorded"
SCENARIOS = sorted(p.stem for p in RECORDED.glob("*.yaml"))


def _load(name: str) -> dict:
    return yaml.safe_load((RECORDED / f"{name}.yaml").read_text())


def test_all_phases_are_covered():
    assert {"pending", "admitted", "running", "evicted_by_preemption", "failed", "succeeded"} <= set(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_objects_are_valid_api_objects(name, validate_k8s):
    recorded = _load(name)
    for obj in [recorded["job"], recorded["workload"], *recorded["pods"]]:
        validate_k8s(obj)


@pytest.mark.parametrize("name", SCENARIOS)
def test_status_mapping(name):
    recorded = _load(name)
    expect = recorded["expect"]
    status = job_status(recorded["job"], recorded["workload"], recorded["pods"])
    assert status.state is JobState(expect["state"]), status
    assert expect["reason_contains"] in status.reason
    assert (status.preemptions, status.restarts) == (expect["preemptions"], expect["restarts"])
    if "exit_code" in expect:
        assert status.exit_code == expect["exit_code"]


def test_deleted_job_reads_as_cancelled():
    assert job_status(None, None, []).state is JobState.CANCELLED


def test_suspended_job_without_workload_points_at_kueue():
    job = _load("pending")["job"]
    status = job_status(job, None, [])
    assert status.state is JobState.PENDING
    assert "LocalQueue" in status.reason


def test_deactivated_workload_is_a_failure():
    recorded = _load("requeued_after_preemption")
    recorded["workload"]["spec"]["active"] = False
    status = job_status(recorded["job"], recorded["workload"], [])
    assert status.state is JobState.FAILED and "deactivated" in status.reason
