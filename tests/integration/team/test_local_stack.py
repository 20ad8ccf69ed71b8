"""The team stack on one machine (deploy/team/local-stack.sh): PostgreSQL, SeaweedFS S3, an MLflow tracking server
and the platform server on PostgreSQL storage, started as an operator would, and the example pipeline on it.

One stack for the module, on free ports in a temporary directory; `down` must leave none of its processes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fixtures.platform import OUTSIDE_SETTINGS, ROOT, TP, Platform, last_json, server_logs
from tests.fixtures.s3 import port_is_free
from tests.fixtures.worker import wait_until
from tests.integration.server.runs import step_reached, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
STACK = ROOT / "deploy" / "team" / "local-stack.sh"


def _free_ports(count: int, taken: set[int]) -> int:
    """A base port P with P..P+count-1 and the gRPC ports P+10000.. free (weed serves gRPC on port + 10000)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = 20000 + probe.getsockname()[1] % 30000
        ports = {*range(base, base + count), *range(base + 10000, base + 10000 + count)}
        if not ports & taken and all(port_is_free(p) for p in ports):
            taken |= ports
            return base


class Stack:
    def __init__(self, directory: Path):
        self.dir = directory
        taken: set[int] = set()
        self.env = {k: v for k, v in os.environ.items() if k not in OUTSIDE_SETTINGS} | {
            "TP_STACK_DIR": str(directory),
            "TP_STACK_PG_PORT": str(_free_ports(1, taken)),
            "TP_STACK_S3_PORT": str(_free_ports(4, taken)),  # S3, then weed's master, volume and filer
            "TP_STACK_MLFLOW_PORT": str(_free_ports(1, taken)),
            "TP_STACK_SERVER_PORT": str(_free_ports(1, taken)),
            "TP_SCHEDULES": "off",
        }

    def script(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(STACK), command], env=self.env, capture_output=True, text=True, timeout=timeout)

    @functools.cached_property
    def settings(self) -> dict[str, str]:
        """What `env` prints, as a dict (the settings `tp` and the tests use; fixed once `up` made them)."""
        printed = self.script("env")
        assert printed.returncode == 0, printed.stderr
        lines = [line.removeprefix("export ") for line in printed.stdout.splitlines() if line.startswith("export ")]
        return dict(line.split("=", 1) for line in lines)

    def tp(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = self.env | self.settings
        return subprocess.run([TP, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)

    def pids(self) -> dict[str, int]:
        """The processes `up` recorded: PostgreSQL, weed, the MLflow server, and the platform server's parts."""
        found = {p.stem: int(p.read_text()) for p in (self.dir / "run").glob("*.pid")}
        found["postgres"] = int((self.dir / "pg" / "postmaster.pid").read_text().split()[0])
        server = json.loads((self.dir / "home" / "server" / "server.json").read_text())
        return found | {name: process["pid"] for name, process in server["processes"].items()}

    @staticmethod
    def command_lines() -> list[str]:
        return [" ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # Not under pytest's own temporary directory (mode 700): PostgreSQL runs as its own user, who must enter it.
    directory = Path(tempfile.mkdtemp(prefix="tp-stack-"))
    directory.chmod(0o755)
    stack = Stack(directory)
    up = stack.script("up")
    assert up.returncode == 0, up.stderr[-4000:] + "".join(
        f"\n--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in (stack.dir / "log").glob("*.log")
    )
    started = stack.pids()
    try:
        yield stack
    finally:
        started |= stack.pids()  # a part a test restarted has a new pid: `down` must stop that one too
        down = stack.script("down")
        assert down.returncode == 0, down.stderr[-3000:]
        left = {name: pid for name, pid in started.items() if psutil.pid_exists(pid)}
        if not left:
            shutil.rmtree(directory, ignore_errors=True)
        assert not left, f"local-stack.sh down left {left} running"


@pytest.fixture(scope="module")
def trained(stack: Stack) -> dict:
    proc = stack.tp("train", "examples/digits.yaml", "--json")
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

    # The tracking server holds the run and the registered version.
    client = MlflowClient(settings["MLFLOW_TRACKING_URI"])
    assert client.get_run(trained["mlflow_run_id"]).info.status == "FINISHED"
    version = client.get_model_version(trained["model_name"], trained["model_version"])
    assert version.run_id == trained["mlflow_run_id"]


def test_the_stacks_credentials_appear_in_no_file_log_or_record(stack, trained):
    """The database password and the S3 secret key live in the environment (and stack.env) only."""
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


def test_postgres_restarted_while_a_run_trains_the_run_finishes_with_its_lineage_and_events(stack, tmp_path):
    spec = write_spec(
        tmp_path,
        "pg-restart",
        training={"max_steps": 6000, "log_every": 100},
        resources={"procs_per_node": 1},
        checkpoint={"every_steps": 2000},
    )
    detached = stack.tp("train", str(spec), "--detach", "--json")
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = last_json(detached)["run_id"]
    home = stack.dir / "home"
    wait_until(lambda: step_reached(Platform(home, {}), run_id) >= 300, 300, f"run {run_id} training past step 300")
    pg_ctl = [str(next(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), "-D", str(stack.dir / "pg")]
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    log = stack.dir / "log" / "postgres.log"  # without -l the postmaster would hold our captured stdout open
    restarted = subprocess.run(
        [*as_postgres, *pg_ctl, "-l", str(log), "-m", "fast", "-w", "restart"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert restarted.returncode == 0, restarted.stderr
    assert step_reached(Platform(home, {}), run_id) < 6000, "the restart came after the run ended"

    row = wait_until(
        lambda: (r := _row(stack, run_id)) and r["state"] in ("SUCCEEDED", "FAILED", "CANCELED") and r,
        600,
        f"run {run_id} to end",
    )
    assert row["state"] == "SUCCEEDED", row
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


def _row(stack: Stack, run_id: str) -> dict | None:
    proc = stack.tp("runs", "--json", "--limit", "200")
    if proc.returncode != 0:
        return None  # the server's storage may still be coming back
    return next((r for r in last_json(proc)["runs"] if r["run_id"] == run_id), None)


def _crash(stack: Stack, part: str) -> None:
    """SIGKILL a part of the stack (its whole process group), as a crash or an OOM kill would."""
    pid = int((stack.dir / "run" / f"{part}.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(pid), 30, f"{part} ({pid}) gone")


def test_tracking_server_and_s3_down_30_s_while_a_run_trains_and_checkpoints(stack, tmp_path, monkeypatch):
    """The MLflow server and the bucket crash together mid-run and come back 30 s later (`up` restarts them):
    the run finishes, MLflow has every step it logged, and every checkpoint in the bucket restores whole."""
    from mlflow.tracking import MlflowClient

    from training_platform.checkpoints.store import open_store
    from training_platform.runlog import RunEvents

    spec = write_spec(
        tmp_path,
        "outage",
        training={"max_steps": 25000, "log_every": 50},  # ~100 s here: outlasts the outage
        resources={"procs_per_node": 1},
        checkpoint={"every_steps": 250},
    )
    detached = stack.tp("train", str(spec), "--detach", "--json")
    assert detached.returncode == 0, detached.stderr[-3000:]
    run_id = last_json(detached)["run_id"]
    platform = Platform(stack.dir / "home", {})
    wait_until(lambda: step_reached(platform, run_id) >= 300, 300, f"run {run_id} training past step 300")
    _crash(stack, "mlflow")
    _crash(stack, "weed")
    down_from = step_reached(platform, run_id)
    time.sleep(30)  # the length of the outage, not a wait for an event
    down_until = step_reached(platform, run_id)
    assert down_until < 25000, "the run ended during the outage; give it more steps"
    again = stack.script("up")
    assert again.returncode == 0, again.stderr[-3000:]

    row = wait_until(
        lambda: (r := _row(stack, run_id)) and r["state"] in ("SUCCEEDED", "FAILED", "CANCELED") and r,
        600,
        f"run {run_id} to end",
    )
    assert row["state"] == "SUCCEEDED", row
    events = RunEvents(stack.dir / "home" / "runs" / run_id).read()
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
    assert scan.manifests and scan.manifests[-1].step == 25000
    for manifest in scan.manifests:
        store.load(manifest)
