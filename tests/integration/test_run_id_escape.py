"""The reported attack on run ids, for real: a `training_runs` partition keyed `../outside` (the UI
accepts any key) must not train a spec planted outside `$TP_HOME/runs`, nor write anything there."""

import dagster as dg
import pytest

from tests.fixtures.materialize import materialize_partition, step_failure_message
from training_platform.paths import PlatformHome
from training_platform.spec import parse_spec

pytestmark = pytest.mark.integration


def test_a_partition_key_with_dots_fails_the_run_and_touches_nothing_outside(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    home = PlatformHome.from_env().ensure()
    planted = tmp_path / "home" / "outside"
    planted.mkdir()
    spec = parse_spec({"name": "planted", "team": "qa", "owner": "x", "dataset": {"snapshot_id": "0" * 64}})
    (planted / "submitted_spec.json").write_text(spec.model_dump_json())
    key = "../outside"  # runs/../outside
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("training_runs", [key])
        result = materialize_partition(instance, key)
    assert not result.success
    assert "run id '../outside' is not allowed" in step_failure_message(result)
    assert [p.name for p in planted.iterdir()] == ["submitted_spec.json"]
    assert not any(home.runs.iterdir())
