"""Daily snapshots, the new-data sensor, nightly retraining and backfills: real Dagster, GX and torchrun."""

from __future__ import annotations

import gc
import json
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
from dagster._core.storage.defs_state.base import set_defs_state_storage

from assets import ALL_ASSETS
from assets.datasets import EXPECTATIONS, resolve_snapshot_id
from definitions import defs
from sensors.new_data import new_data_sensor
from sensors.retraining import (
    RETRAINING,
    RetrainingConfig,
    build_retraining_schedule,
    nightly_retraining,
    retraining_sensor,
)
from training_platform.datasets import build_snapshot, load_manifest
from training_platform.datasets.daily import default_landing, seed_landing
from training_platform.errors import SpecError
from training_platform.paths import PlatformHome
from training_platform.runs.retraining import register_day_run
from training_platform.runs.specs import load_run_spec, register_run
from training_platform.spec import parse_spec
from training_platform.spec.submission import THEN_TRAIN_TAG, snapshot_run_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NOV = {day: date(2026, 11, day) for day in range(1, 8)}


@pytest.fixture
def home(tmp_path, monkeypatch) -> PlatformHome:
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    return PlatformHome.from_env().ensure()


@pytest.fixture
def instance(home):
    # Dagster keeps "the current instance's state storage" in a context variable. A Dagster context
    # an earlier test left open (one not used as a `with`) resets that variable when the garbage
    # collector finalizes it; finalized in the middle of this test, it pointed materialize() at a
    # disposed instance ("Attempted to resolve undefined DagsterInstance weakref", 2 of 6 full runs).
    # Collected here, before this test sets the variable, such leftovers can no longer do that.
    gc.collect()
    with dg.DagsterInstance.get() as instance:
        yield instance


def _snapshot(instance, day: date, tags: dict | None = None, source: str = "digits_daily"):
    # The variable set again for this call (see the `instance` fixture): materialize() reads it first thing.
    with set_defs_state_storage(instance.defs_state_storage):
        return dg.materialize(
            ALL_ASSETS,
            selection=["dataset_snapshot"],
            partition_key=day.isoformat(),
            instance=instance,
            resources=defs.resources,
            run_config=snapshot_run_config(source),
            tags=tags or {},
            raise_on_error=False,
        )


def _tick(sensor, instance, cursor=None) -> dg.SensorResult:
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources) as context:
        return sensor(context)


def test_new_data_sensor_requests_exactly_the_new_or_changed_day(home, instance):
    landing = default_landing(home.root)
    seed_landing(landing, NOV[2], 2)
    first = _tick(new_data_sensor, instance)
    assert [(r.partition_key, r.tags["tp/drop"]) for r in first.run_requests] == [
        ("2026-11-02", "2026-11-02.parquet"),
        ("2026-11-03", "2026-11-03.parquet"),
    ]
    quiet = _tick(new_data_sensor, instance, first.cursor)
    assert quiet.run_requests == [] and quiet.skip_reason is not None

    # A new day lands: exactly that day is requested.
    table = pq.read_table(landing / "2026-11-03.parquet")
    pq.write_table(table.slice(0, 100), landing / "2026-11-05.parquet")
    new_day = _tick(new_data_sensor, instance, quiet.cursor)
    assert [r.partition_key for r in new_day.run_requests] == ["2026-11-05"]

    # A drop is corrected: its day again, under a new run key (the content changed).
    pq.write_table(table.slice(0, 90), landing / "2026-11-05.parquet")
    corrected = _tick(new_data_sensor, instance, new_day.cursor)
    assert [r.partition_key for r in corrected.run_requests] == ["2026-11-05"]
    assert corrected.run_requests[0].run_key != new_day.run_requests[0].run_key
    assert corrected.run_requests[0].run_config == snapshot_run_config("digits_daily")


def test_new_data_sensor_leaves_out_a_drop_its_days_snapshot_was_built_from(home, instance):
    """`tp retrain` backfilled the day: the sensor's first look must not build it again."""
    landing = default_landing(home.root)
    seed_landing(landing, NOV[2], 2)
    assert _snapshot(instance, NOV[2]).success
    first = _tick(new_data_sensor, instance)
    assert [r.partition_key for r in first.run_requests] == ["2026-11-03"]
    # The built day's drop corrected: built again.
    table = pq.read_table(landing / "2026-11-02.parquet")
    pq.write_table(table.slice(0, 100), landing / "2026-11-02.parquet")
    corrected = _tick(new_data_sensor, instance, first.cursor)
    assert [r.partition_key for r in corrected.run_requests] == ["2026-11-02"]


def test_nightly_tick_registers_the_days_run_and_requests_its_snapshot(home, instance):
    seed_landing(default_landing(home.root), NOV[2], 3)
    context = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 11, 5, 2, 0, tzinfo=UTC), resources=defs.resources
    )
    request = nightly_retraining(context)
    run_id = "digits-daily-2026-11-04"  # the day just finished
    assert request.partition_key == "2026-11-04"
    assert request.tags[THEN_TRAIN_TAG] == run_id
    assert request.run_config == snapshot_run_config("digits_daily")
    assert run_id in instance.get_dynamic_partitions("training_runs")
    spec = load_run_spec(home, run_id)
    assert spec.dataset.as_of == NOV[4] and spec.dataset.snapshot_id is None and spec.dataset.source == "digits_daily"
    assert (nightly_retraining.cron_schedule, nightly_retraining.execution_timezone) == ("0 2 * * *", "UTC")


def test_the_schedule_takes_its_cron_and_timezone_from_config(home, instance):
    seed_landing(default_landing(home.root), NOV[2], 3)
    settings = RetrainingConfig(cron="30 3 * * *", timezone="America/New_York")
    schedule = build_retraining_schedule(settings)
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("30 3 * * *", "America/New_York")
    # 03:00 UTC on the 5th is still the 4th in New York: the day just finished there is the 3rd.
    at = datetime(2026, 11, 5, 3, 0, tzinfo=UTC)
    context = dg.build_schedule_context(instance=instance, scheduled_execution_time=at, resources=defs.resources)
    request = schedule(context)
    assert request.partition_key == "2026-11-03"


def test_schedule_skips_when_no_data_has_landed(home, instance):
    context = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=datetime(2026, 11, 5, 2, 0, tzinfo=UTC), resources=defs.resources
    )
    assert isinstance(nightly_retraining(context), dg.SkipReason)
    assert instance.get_dynamic_partitions("training_runs") == []


def test_backfilled_and_scheduled_snapshots_start_their_days_training_runs(home, instance):
    seed_landing(default_landing(home.root), NOV[2], 3)
    assert _snapshot(instance, NOV[2], {"dagster/backfill": "bf-1"}).success  # a backfill from the UI
    assert _snapshot(instance, NOV[3]).success  # the new-data sensor's: waits for the night
    register_day_run(home, RETRAINING.spec(), NOV[4])  # what the schedule does before it requests the snapshot
    assert _snapshot(instance, NOV[4], {THEN_TRAIN_TAG: "digits-daily-2026-11-04"}).success  # the schedule's
    assert _snapshot(instance, NOV[4], {"dagster/backfill": "bf-2"}, source="sklearn_digits").success  # other source

    result = _tick(retraining_sensor, instance)
    expected = ["digits-daily-2026-11-02", "digits-daily-2026-11-04"]
    assert [r.partition_key for r in result.run_requests] == expected
    assert [r.run_key for r in result.run_requests] == expected
    (add,) = result.dynamic_partitions_requests
    assert (add.partitions_def_name, list(add.partition_keys)) == ("training_runs", expected)
    assert load_run_spec(home, expected[0]).dataset.as_of == NOV[2]

    # The same materializations never start a second run; a day rebuilt later is not retrained either.
    assert _tick(retraining_sensor, instance, result.cursor).run_requests == []

    # Each day's run resolves its own day's snapshot; the newest digits_daily day when none is named.
    ids = {day: resolve_snapshot_id(instance, "digits_daily", NOV[day]) for day in (2, 3, 4)}
    assert len(set(ids.values())) == 3
    assert resolve_snapshot_id(instance, "digits_daily", None) == ids[4]
    digits = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    assert resolve_snapshot_id(instance, "sklearn_digits", None) == digits
    with pytest.raises(SpecError, match="dataset.as_of: no dataset_snapshot of digits_daily for 2026-11-06"):
        resolve_snapshot_id(instance, "digits_daily", NOV[6])


def test_a_drop_that_fails_the_expectations_is_blocked(home, instance):
    landing = default_landing(home.root)
    seed_landing(landing, NOV[2], 1)
    table = pq.read_table(landing / "2026-11-02.parquet")
    labels = table.column("label").to_numpy().copy()
    labels[3] = 11  # no such digit
    bad = table.set_column(table.schema.get_field_index("label"), "label", [labels])
    pq.write_table(bad, landing / "2026-11-03.parquet")

    result = _snapshot(instance, NOV[3], {"dagster/backfill": "bf"})
    assert not result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == EXPECTATIONS and not check.passed
    with pytest.raises(SpecError, match="failed its expectations"):
        resolve_snapshot_id(instance, "digits_daily", NOV[3])
    assert _tick(retraining_sensor, instance).run_requests == []

    # Named by id, the failed snapshot is refused all the same, before anything launches.
    failed_id = check.metadata["snapshot_id"].value
    spec = parse_spec({"name": "pinned", "team": "qa", "owner": "ci", "dataset": {"snapshot_id": failed_id},
                       "training": {"max_steps": 5}, "resources": {"procs_per_node": 1}})
    register_run(home, spec, "pinned-1")
    instance.add_dynamic_partitions("training_runs", ["pinned-1"])
    pinned = dg.materialize(ALL_ASSETS, selection=["training_run"], partition_key="pinned-1", instance=instance,
                            resources=defs.resources, raise_on_error=False)
    assert not pinned.success
    failure = next(e for e in pinned.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.to_string() if failure.step_failure_data.error else ""
    assert f"dataset.snapshot_id: snapshot {failed_id} failed its expectations" in message, message
    assert not (home.run_dir("pinned-1") / "worker.log").exists()


def test_a_corrupted_shard_fails_the_run_before_training_naming_the_shard(home, instance):
    manifest = build_snapshot("sklearn_digits", home.snapshots)
    split, shard = next(manifest.shards())
    path = home.snapshots / shard.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    spec = parse_spec(
        {
            "name": "corrupt",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": manifest.snapshot_id},
            "training": {"max_steps": 5, "eval_every": 5, "log_every": 1},
            "resources": {"procs_per_node": 1},
            "checkpoint": {"every_steps": 1},
        }
    )
    register_run(home, spec, "corrupt-1")
    instance.add_dynamic_partitions("training_runs", ["corrupt-1"])
    result = dg.materialize(
        ALL_ASSETS,
        selection=["training_run"],
        partition_key="corrupt-1",
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    text = json.dumps(failure.step_failure_data.error.to_string() if failure.step_failure_data.error else "")
    text += json.dumps({k: str(v.value) for k, v in failure.step_failure_data.user_failure_data.metadata.items()})
    assert str(path) in text and "corrupted" in text
    # Early: not one step trained, not one checkpoint written.
    assert not list((home.checkpoints).rglob("*corrupt-1*"))
    log = home.run_dir("corrupt-1") / "worker.log"
    assert "step 1:" not in (log.read_text() if log.exists() else "")
    assert load_manifest(home.snapshots, manifest.snapshot_id).snapshot_id == manifest.snapshot_id
