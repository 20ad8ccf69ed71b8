"""The team stack on one machine (deploy/team/local-stack.sh): PostgreSQL, SeaweedFS S3, an MLflow tracking server
and the platform server on PostgreSQL storage, started as an operator would, and the example pipeline on it; then
its faults: the database restarted, the tracking server and the bucket down, each under a live run.

One stack for the module, on free ports in a temporary directory; `down` must leave none of its processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.platform import last_json, server_logs
from tests.fixtures.team_stack import Stack, running_stack
from tests.fixtures.worker import wait_until
from tests.integration.server.runs import (
    detach,
    ended_row,
    paced_entrypoint,
    processes_of,
    step_reached,
    write_spec,
    write_sweep,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack() as running:
        yield running


@pytest.fixture(scope="module")
def trained(stack: Stack) -> dict:
    proc = stack.tp("train", "examples/digits.yaml", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(stack.dir / "home")
    return last_json(proc)


@pytest.fixture(scope="module")
def swept(stack: Stack, tmp_path_factory) -> dict:
    """A two-trial sweep of short digits runs, through the stack's platform server."""
    path = write_sweep(tmp_path_factory.mktemp("sweep"), "stack-sweep", 2, 5, max_steps=20, eval_every=10, log_every=10)
    proc = stack.tp("sweep", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:] + server_logs(stack.dir / "home")
    return last_json(proc)


def test_the_stack_reports_each_part_and_prints_its_settings(stack):
    status = stack.script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    for part in ("postgres: running", "s3: running", "mlflow: running", "UI and API"):
        assert part in status.stdout + status.stderr, status.stdout + status.stderr
    settings = stack.settings
    assert settings["TP_DAGSTER_DATABASE_URL"].startswith("postgresql+psycopg2://tp:")
    assert settings["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:")
    before = stack.pids()
    again = stack.script("up")  # a running stack is kept, not doubled
    assert again.returncode == 0 and stack.pids() == before, again.stderr


def test_the_pipeline_runs_on_the_stack_database_tracking_server_and_bucket(stack, trained):
    import boto3
    import psycopg2
    from mlflow.tracking import MlflowClient

    assert trained["status"] == "SUCCEEDED" and trained["model_version"] == "1"
    settings = stack.settings
    assert trained["tracking_uri"] == settings["MLFLOW_TRACKING_URI"]
    assert trained["checkpoints"] and all(c["uri"].startswith("s3://") for c in trained["checkpoints"])

    # Dagster's runs and events are in PostgreSQL.
    url = settings["TP_DAGSTER_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(url) as connection, connection.cursor() as cursor:
        cursor.execute("select run_id from runs where status = 'SUCCESS'")
        assert trained["dagster_run_id"] in {row[0] for row in cursor.fetchall()}
    assert not list((stack.dir / "home" / "dagster").glob("*.db")), "Dagster wrote a SQLite store in the home"

    # Checkpoints and MLflow's artifacts (plots, the model) are in the bucket; none in the home.
    s3 = boto3.client(
        "s3",
        endpoint_url=settings["TP_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"],
    )
    bucket, prefix = settings["TP_CHECKPOINT_STORE_URI"].removeprefix("s3://").split("/", 1)
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    assert any(k.startswith(f"{prefix}/runs/{trained['run_id']}/") for k in keys), keys[:20]
    mlflow_keys = [k for k in keys if k.startswith("mlflow/") and trained["mlflow_run_id"] in k]
    assert any(k.endswith("plots/loss_curve.png") for k in mlflow_keys), mlflow_keys
    assert not any((stack.dir / "home" / "checkpoints").iterdir())
    assert not any((stack.dir / "home" / "mlartifacts").iterdir())
    # So is the dataset snapshot the run trained on, which a job on another machine reads from there.
    snapshots = settings["TP_SNAPSHOT_STORE_URI"].removeprefix(f"s3://{bucket}/")
    assert f"{snapshots}/{trained['snapshot_id']}.json" in keys, [k for k in keys if k.startswith(snapshots)]
    assert any(k.startswith(f"{snapshots}/shards/") for k in keys)
    assert not (stack.dir / "home" / "snapshots").exists()

    # Its spec and its charges are in the platform's database, where a run worker, the daemon and `tp cost`
    # on any machine read them; the home has neither.
    platform_db = settings["TP_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(platform_db) as connection, connection.cursor() as cursor:
        cursor.execute("select key from tp_cost_ledger where run_id = %s", (trained["run_id"],))
        assert f"{trained['run_id']}#1" in {row[0] for row in cursor.fetchall()}
        cursor.execute("select team, spec from tp_runs where run_id = %s", (trained["run_id"],))
        team, spec = cursor.fetchone()
        assert team == json.loads(spec)["team"] and json.loads(spec)["name"] == "digits-classifier"
    assert not (stack.dir / "home" / "cost").exists()
    assert not list((stack.dir / "home" / "runs").glob("*/submitted_spec.json"))
    report = last_json(stack.tp("cost", "report", "--by", "run", "--json"))
    assert report["totals"][trained["run_id"]]["runs"] == 1 and report["totals"][trained["run_id"]]["total_usd"] > 0

    # The tracking server holds the run and the registered version.
    client = MlflowClient(settings["MLFLOW_TRACKING_URI"])
    assert client.get_run(trained["mlflow_run_id"]).info.status == "FINISHED"
    version = client.get_model_version(trained["model_name"], trained["model_version"])
    assert version.run_id == trained["mlflow_run_id"]


def test_a_sweeps_study_is_in_the_stack_database(stack, swept):
    """Optuna's study and trials are in the stack's PostgreSQL database, as the Dagster runs of its trials are."""
    import psycopg2

    assert swept["trials"] == 2 and swept["fail"] == 0, swept
    settings = stack.settings
    url = settings["TP_SWEEP_STORAGE"].replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "select count(*) from trials join studies using (study_id) where study_name = %s and state = 'COMPLETE'",
            ("stack-sweep",),
        )
        assert cursor.fetchone()[0] == 2
    assert not (stack.dir / "home" / "sweeps.db").exists(), "Optuna wrote a SQLite study in the home"
    # The sweep's record (its state, its parent MLflow run) and its trials' specs are in the platform's database,
    # where the sensors, the queue's coordinator and a run worker on any machine read them; the home has none.
    platform_db = settings["TP_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")

    def sweep_record() -> dict:
        with psycopg2.connect(platform_db) as connection, connection.cursor() as cursor:
            cursor.execute("select body from tp_documents where kind = 'sweep' and name = %s", ("stack-sweep",))
            return json.loads(cursor.fetchone()[0])

    # The sweeps sensor marks it finished on its next tick after the result is in the catalog.
    record = wait_until(lambda: (r := sweep_record())["state"] == "FINISHED" and r, 120, "the sweep marked FINISHED")
    assert record["parent_mlflow_run_id"], record
    with psycopg2.connect(platform_db) as connection, connection.cursor() as cursor:
        cursor.execute("select count(*) from tp_runs where trial is not null and run_id like %s", ("stack-sweep-t%",))
        assert cursor.fetchone()[0] == 2
    assert not (stack.dir / "home" / "sweeps").exists()
    assert not list((stack.dir / "home" / "runs").glob("*/sweep_trial.json"))


def test_the_stacks_credentials_appear_in_no_file_log_or_record(stack, trained, swept):
    """The database password and the S3 secret key live in the environment (and stack.env) only."""
    import boto3
    import psycopg2
    from mlflow.tracking import MlflowClient

    settings = stack.settings
    password = settings["TP_DAGSTER_DATABASE_URL"].split(":")[2].split("@")[0]
    secrets = {password, settings["AWS_SECRET_ACCESS_KEY"]}
    assert all(len(secret) >= 16 for secret in secrets)
    leaks = [line[:80] for line in stack.command_lines() if any(s in line for s in secrets)]  # `ps` shows these
    for path in [*(stack.dir / "home").rglob("*"), *(stack.dir / "log").glob("*")]:
        if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets):
            leaks.append(str(path))
    run = MlflowClient(settings["MLFLOW_TRACKING_URI"]).get_run(trained["mlflow_run_id"])
    for where, values in (("MLflow params", run.data.params), ("MLflow tags", run.data.tags)):
        if any(s in str(values) for s in secrets):
            leaks.append(where)
    # The bucket: checkpoint manifests, the registered model's files, plots (chunks of weights are not text).
    s3 = boto3.client(
        "s3",
        endpoint_url=settings["TP_S3_ENDPOINT_URL"],
        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    bucket = settings["TP_CHECKPOINT_STORE_URI"].removeprefix("s3://").split("/", 1)[0]
    objects = [o for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page["Contents"]]
    manifests = [o["Key"] for o in objects if "/runs/" in o["Key"] and o["Key"].endswith(".json")]
    assert manifests, [o["Key"] for o in objects][:20]
    for obj in objects:
        if obj["Size"] <= 1 << 20:
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            if any(secret.encode() in body for secret in secrets):
                leaks.append(f"s3://{bucket}/{obj['Key']}")
    url = settings["TP_DAGSTER_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(url) as connection, connection.cursor() as cursor:
        for secret in secrets:
            cursor.execute("select count(*) from event_logs where event like %s", (f"%{secret}%",))
            if cursor.fetchone()[0]:
                leaks.append("Dagster event log")
            cursor.execute("select count(*) from runs where run_body like %s", (f"%{secret}%",))
            if cursor.fetchone()[0]:
                leaks.append("Dagster run records")
    assert not leaks, f"a credential of the stack is written in {leaks}"


def _backend_pid(storage) -> int:
    import sqlalchemy

    with storage._engine.connect() as connection:  # the storage's own pool
        return connection.execute(sqlalchemy.text("select pg_backend_pid()")).scalar()


def test_dagster_storage_keeps_one_connection_and_a_forked_child_opens_its_own(stack):
    """Outside the webserver Dagster connected anew for every event (a password login each); ours keeps one."""
    import psycopg2

    from training_platform_dagster.postgres_storage import EventLogStorage

    url = stack.settings["TP_DAGSTER_DATABASE_URL"]
    storage = EventLogStorage(postgres_url=url, should_autocreate_tables=False)
    try:
        kept = _backend_pid(storage)
        assert _backend_pid(storage) == kept
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child must not talk over its parent's socket
            os.write(write, str(_backend_pid(storage)).encode())
            os._exit(0)
        os.close(write)
        child = int(os.read(read, 32))
        os.waitpid(pid, 0)
        assert child != kept
        assert _backend_pid(storage) == kept, "the child's use broke the parent's connection"
    finally:
        storage.dispose()
    plain = url.replace("postgresql+psycopg2://", "postgresql://")

    def closed() -> bool:
        with psycopg2.connect(plain) as connection, connection.cursor() as cursor:
            cursor.execute("select count(*) from pg_stat_activity where pid = %s", (kept,))
            return cursor.fetchone()[0] == 0

    wait_until(closed, 30, "the storage's connection closed by dispose()")


def test_postgres_restarted_while_a_run_trains_the_run_finishes_with_its_lineage_and_events(stack, tmp_path):
    spec = write_spec(
        tmp_path,
        "pg-restart",
        training={"max_steps": 6000, "log_every": 100},
        resources={"procs_per_node": 1},
        checkpoint={"every_steps": 2000},
    )
    run_id = detach(stack.platform, spec)
    platform = stack.platform
    wait_until(lambda: step_reached(platform, run_id) >= 300, 300, f"run {run_id} training past step 300")
    pg_ctl = [str(next(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), "-D", str(stack.dir / "pg")]
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    log = stack.dir / "log" / "postgres.log"  # without -l the postmaster would hold our captured stdout open
    from training_platform_dagster.postgres_storage import RunStorage

    opened_before = RunStorage(postgres_url=stack.settings["TP_DAGSTER_DATABASE_URL"], should_autocreate_tables=False)
    before = _backend_pid(opened_before)
    # The run's own processes wait out the restart, stopped: on a fast machine the rest of its 6000 steps took less
    # than the restart. Its Dagster run, in the server, goes on and meets the restart.
    training = processes_of(run_id)
    assert training, "the run's processes are found by their command lines and directory"
    for process in training:
        process.suspend()
    try:
        restarted = subprocess.run(
            [*as_postgres, *pg_ctl, "-l", str(log), "-m", "fast", "-w", "restart"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for process in training:
            process.resume()
    assert restarted.returncode == 0, restarted.stderr
    # A connection the pool kept across the restart is found dead and replaced, not handed out.
    assert _backend_pid(opened_before) != before
    opened_before.dispose()
    assert step_reached(platform, run_id) < 6000, "the restart came after the run ended"
    # The server answers the first requests after the restart (its pooled connections were cut).
    for _ in range(3):
        listed = stack.tp("runs", "--json")
        assert listed.returncode == 0, listed.stderr[-3000:]

    row = _ended(stack, run_id)
    assert row["state"] == "SUCCEEDED", (row, _logs(stack, run_id))
    settings = stack.settings
    url = settings["TP_DAGSTER_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")
    import psycopg2

    with psycopg2.connect(url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "select dagster_event_type, asset_key from event_logs where run_id = %s", (row["dagster_run_id"],)
        )
        events = cursor.fetchall()
    kinds = {kind for kind, _ in events}
    # Dagster stores a run's start and success under their old names.
    assert {"PIPELINE_START", "PIPELINE_SUCCESS", "ASSET_MATERIALIZATION"} <= kinds, kinds
    assert "STEP_FAILURE" not in kinds, kinds
    materialized = {key for kind, key in events if kind == "ASSET_MATERIALIZATION"}
    lineage = {f'["{asset}"]' for asset in ("training_run", "checkpoints", "evaluated_model", "registered_model")}
    assert lineage <= materialized, materialized


def _ended(stack: Stack, run_id: str) -> dict:
    """The run's `tp runs` row once it ended."""
    return ended_row(stack.platform, run_id, row=lambda _, run: _row(stack, run))


def _logs(stack: Stack, run_id: str) -> str:
    """The tail of the run's Dagster log (`tp logs`), for assertion messages."""
    shown = stack.tp("logs", run_id)
    return (shown.stdout + shown.stderr)[-4000:]


def _row(stack: Stack, run_id: str) -> dict | None:
    proc = stack.tp("runs", "--json", "--limit", "200")
    if proc.returncode != 0:
        return None  # the server's storage may still be coming back
    return next((r for r in last_json(proc)["runs"] if r["run_id"] == run_id), None)


OUTAGE_RUN_STEPS = 20000


def test_tracking_server_and_s3_down_30_s_while_a_run_trains_and_checkpoints(stack, tmp_path, monkeypatch):
    """The MLflow server and the bucket crash together mid-run and come back 30 s later (`up` restarts them):
    the run finishes, MLflow has every step it logged, and every checkpoint in the bucket restores whole."""
    from mlflow.tracking import MlflowClient

    from training_platform.checkpoints.store import open_store
    from training_platform.runs.events import RunEvents

    pace = tmp_path / "paced"
    pace.touch()
    spec = write_spec(
        tmp_path,
        "outage",
        # At least 100 s of training while paced (5 ms a step, by the clock): it must outlast the outage and the
        # restart (~50 s) with room to spare, however busy the machine; once the services are back, the rest runs
        # at full speed. A save every 1000 steps (5 s) tries a few in the outage.
        entrypoint=paced_entrypoint(pace),
        training={"max_steps": OUTAGE_RUN_STEPS, "log_every": 50},
        resources={"procs_per_node": 1},
        checkpoint={"every_steps": 1000},
    )
    run_id = detach(stack.platform, spec)
    platform = stack.platform
    wait_until(lambda: step_reached(platform, run_id) >= 300, 300, f"run {run_id} training past step 300")
    stack.crash("mlflow")
    stack.crash("weed")
    down_from = step_reached(platform, run_id)
    time.sleep(30)  # the length of the outage, not a wait for an event
    down_until = step_reached(platform, run_id)
    assert down_until < OUTAGE_RUN_STEPS, "the run ended during the outage; give it more steps"
    again = stack.script("up")
    assert again.returncode == 0, again.stderr[-3000:] + stack.logs()
    back = step_reached(platform, run_id)
    assert back < OUTAGE_RUN_STEPS, "the run ended before the services were back; give it more steps"
    pace.unlink()  # it trained through the outage and the restart: the rest need not wait for the clock

    row = _ended(stack, run_id)
    assert row["state"] == "SUCCEEDED", (row, _logs(stack, run_id))
    events = RunEvents(stack.home / "runs" / run_id).read()
    saves = [e["step"] for e in events if e["kind"] in ("checkpoint", "checkpoint_failed")]
    assert any(down_from < step <= down_until for step in saves), (down_from, down_until, saves)

    # Every step the worker reported reached the tracking server, the ones logged in the outage too.
    logged = sorted({e["step"] for e in events if e["kind"] == "progress"})
    assert any(down_from < step <= down_until for step in logged)
    client = MlflowClient(stack.settings["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("ml-platform/outage")
    (tracked,) = client.search_runs([experiment.experiment_id], f"tags.training_run = '{run_id}'")
    assert tracked.info.status == "FINISHED"
    history = client.get_metric_history(tracked.info.run_id, "train_loss")
    assert sorted(m.step for m in history) == logged

    # No checkpoint the bucket shows is torn: each one visible loads and verifies.
    for name, value in stack.settings.items():
        monkeypatch.setenv(name, value)
    store = open_store(stack.settings["TP_CHECKPOINT_STORE_URI"])
    scan = store.scan(run_id)
    assert not scan.unreadable, scan.unreadable
    assert scan.manifests and scan.manifests[-1].step == OUTAGE_RUN_STEPS
    for manifest in scan.manifests:
        store.load(manifest)
