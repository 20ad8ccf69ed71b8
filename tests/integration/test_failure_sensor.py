"""The run-status sensor retries a failed (not preempted) run only as often as the spec allows."""

import dagster as dg
import pytest

from tests.fixtures.materialize import failure_requests, materialize_partition
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    return PlatformHome.from_env().ensure()


def _fail(instance, home: PlatformHome, run_id: str, spec, tags: dict | None = None):
    """Materialize a run that fails (registered on its first attempt)."""
    if not (home.run_dir(run_id) / "submitted_spec.json").exists():
        register_run(home, spec, run_id)
        instance.add_dynamic_partitions("training_runs", [run_id])
    result = materialize_partition(instance, run_id, tags=tags)
    assert not result.success
    return result


def _spec(**fields):
    return parse_spec({"name": "doomed", "team": "qa", "owner": "ci", **fields})


def test_failed_run_is_retried_within_its_policy_then_reported(home):
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    # The worker fails at start (a batch larger than the data): a failure, not a preemption.
    spec = _spec(
        dataset={"snapshot_id": snapshot}, training={"batch_size": 4096}, preemption={"retry_failures": 1}
    )
    with dg.DagsterInstance.get() as instance:
        first = _fail(instance, home, "doomed-1", spec)
        (retry,) = failure_requests(instance, first)
        assert retry.partition_key == "doomed-1" and retry.tags["tp/retry_of"] == first.run_id
        assert "FAILED" in retry.tags["tp/reason"]
        again = _fail(instance, home, "doomed-1", spec, tags=retry.tags)  # the retry fails the same way
        assert failure_requests(instance, again) == []  # retry_failures: 1 is used up: reported, not retried again


def test_bad_input_is_reported_and_never_retried(home):
    spec = _spec(dataset={"snapshot_id": "0" * 64}, preemption={"retry_failures": 3})
    with dg.DagsterInstance.get() as instance:
        assert failure_requests(instance, _fail(instance, home, "bad-1", spec)) == []
