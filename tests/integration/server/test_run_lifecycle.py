"""A run's life in the shared platform: detached, followed, cancelled, resumed; the client killed; bad ids.

One platform server (webserver, daemon, code server) for the module; real torchrun ranks, real Slurm.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from tests.fixtures.platform import TP_POLL_S, Platform, free_port, last_json, running_platform, server_logs
from tests.fixtures.worker import wait_until
from tests.integration.server.runs import (
    detach,
    ended_row,
    paced_entrypoint,
    processes_of,
    run_row,
    step_reached,
    weights_of,
    write_spec,
    write_sweep,
)
from training_platform.client.runs import wait_for
from training_platform.launch import standby
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import new_run_id
from training_platform.spec import load_spec
from training_platform.spec.submission import PARTITION_TAG, TRAINING_JOB, training_run_config

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
# Paced by the clock (runs.PACED_SCRIPT) while its pace file exists: the run lasts through a cancel whatever else the
# machine runs, and leaves the cores to the server under test. Without the file it runs at full speed (the
# reference, a resume): the pace changes no weight.
LONG_STEPS = 3000  # at least 12.5 s past the cancel's step 500, at 5 ms a step


def _long(pace: Path) -> dict:
    return {"training": {"max_steps": LONG_STEPS, "log_every": 50}, "resources": {"procs_per_node": 1},
            "checkpoint": {"every_steps": 500, "keep_last": 2},
            "entrypoint": paced_entrypoint(pace)}


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Iterator[Platform]:
    """A server of the module's own, not the worker's shared one: a test here kills and restarts its daemon, and
    another reads the standby every run of the server starts from."""
    with running_platform(tmp_path_factory.mktemp("tp-home")) as running:
        yield running


@pytest.fixture(scope="module")
def reference(platform, tmp_path_factory) -> dict:
    """The uninterrupted run of the long spec, unpaced: the weights a cancelled-then-resumed run must end with."""
    specs = tmp_path_factory.mktemp("specs")
    spec = write_spec(specs, "long-reference", **_long(specs / "never-paced"))
    proc = platform.tp("train", str(spec), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:] + server_logs(platform.home)
    return last_json(proc)


def _cancel_mid_run_then_resume(platform, spec, pace: Path, reference: dict, *launcher: str) -> None:
    pace.touch()
    run_id = detach(platform, spec, *launcher)
    wait_until(lambda: step_reached(platform, run_id) >= 500, 300, f"run {run_id} training past step 500")
    assert processes_of(run_id), "the run's processes are found by their command lines"
    asked = time.monotonic()
    cancelled = platform.tp("cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr[-3000:]
    assert last_json(cancelled)["status"] == "CANCELED"
    wait_until(lambda: not processes_of(run_id), 30, f"no process of {run_id} left after the cancel")
    # 10 s from the cancel, plus the `tp` client's own start on a loaded machine.
    assert time.monotonic() - asked < 15, "a process of the run outlived the cancel by more than 10 s"
    stopped_at = step_reached(platform, run_id)
    assert 500 <= stopped_at < LONG_STEPS, stopped_at  # cancelled mid-run: the rest is the resume's
    assert run_row(platform, run_id)["state"] == "CANCELED"

    pace.unlink()  # what the resume must show is its weights, not its pace
    resumed = platform.tp("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-3000:] + server_logs(platform.home)
    summary = last_json(resumed)
    assert summary["status"] == "SUCCEEDED" and summary["final_step"] == LONG_STEPS
    assert weights_of(summary) == weights_of(reference)  # exactly the uninterrupted weights
    kinds = [e["kind"] for e in RunEvents(platform.home / "runs" / run_id).read()]
    assert "resumed" in kinds  # from its newest checkpoint, not from scratch
    assert run_row(platform, run_id)["attempts"] == 2


def test_cancel_stops_every_process_and_resume_ends_with_the_uninterrupted_weights(platform, reference, tmp_path):
    pace = tmp_path / "paced"
    _cancel_mid_run_then_resume(platform, write_spec(tmp_path, "long-local", **_long(pace)), pace, reference)


def test_cancel_and_resume_on_slurm(platform, reference, tmp_path, slurm_cluster):
    pace = tmp_path / "paced"
    spec = write_spec(tmp_path, "long-slurm", **_long(pace), backend="slurm")
    _cancel_mid_run_then_resume(platform, spec, pace, reference)
    jobs = slurm_cluster.run("squeue", "--noheader", "--format=%i %j").stdout
    assert "long-slurm" not in jobs, jobs  # scancel took the job; the resume's ended


def test_a_killed_client_does_not_stop_the_run(platform, tmp_path):
    spec = write_spec(tmp_path, "client-killed", training={"max_steps": 2000, "log_every": 50},
                      resources={"procs_per_node": 1})
    client = platform.spawn("train", str(spec), "--json", log=tmp_path / "tp.log")
    run_dirs = platform.home / "runs"
    run_id = wait_until(
        lambda: next((d.name for d in run_dirs.glob("client-killed-*") if step_reached(platform, d.name) > 0), None),
        300, "the run to train",
    )
    assert step_reached(platform, run_id) < 2000  # killed while the run trains
    os.killpg(client.pid, signal.SIGKILL)
    client.wait(10)
    row = ended_row(platform, run_id, 300)
    assert row["state"] == "SUCCEEDED" and row["step"] == 2000


def test_unknown_run_ids_get_one_line_naming_the_id_and_how_to_list_runs(platform):
    for command in ("cancel", "logs", "resume", "reproduce"):
        proc = platform.tp(command, "no-such-run")
        assert proc.returncode == 2, (command, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "no-such-run" in lines[0] and "tp runs" in lines[0], (command, proc.stderr)


def test_logs_print_the_worker_log_of_a_run(platform, reference):
    proc = platform.tp("logs", reference["run_id"])
    assert proc.returncode == 0, proc.stderr
    assert f"run {reference['run_id']}: 1 process(es)" in proc.stdout
    assert f"step {LONG_STEPS}:" in proc.stdout
    assert f"finished at step {LONG_STEPS}: weights {reference['final_weights_sha256'][:12]}" \
        in proc.stdout


def test_runs_lists_team_state_steps_and_cost(platform, reference):
    proc = platform.tp("runs", "--team", "ml-platform", "--status", "succeeded", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {row["run_id"]: row for row in last_json(proc)["runs"]}
    row = rows[reference["run_id"]]
    assert row["team"] == "ml-platform" and row["state"] == "SUCCEEDED"
    assert (row["step"], int(row["max_steps"])) == (LONG_STEPS, LONG_STEPS) and row["cost_usd"] > 0
    assert all(r["state"] == "SUCCEEDED" for r in rows.values())
    other_team = last_json(platform.tp("runs", "--team", "nobody", "--json"))
    assert other_team["runs"] == []


def test_status_and_metrics_show_a_training_run_while_it_trains(platform, tmp_path):
    """`tp status` and `tp metrics` read the server (and the run's telemetry): progress, utilization, cost so far."""
    spec = write_spec(tmp_path, "watched", training={"max_steps": 1_000_000, "eval_every": 1_000_000,
                      "log_every": 500}, resources={"procs_per_node": 1}, checkpoint={"every_steps": 1_000_000})
    run_id = detach(platform, spec)
    port = free_port()
    metrics = platform.spawn("metrics", "--port", str(port), log=tmp_path / "metrics.log")
    try:
        row = wait_until(lambda: _status_row(platform, run_id), 300, f"tp status to show {run_id} training",
                         poll=TP_POLL_S)
        assert row["team"] == "ml-platform" and 0 < row["progress"] < 1, row
        assert 0 < row["utilization_pct"] <= 100 and row["cost_usd"] > 0, row
        assert _started_from_the_code_servers_fork_server(platform, run_id)
        body = wait_until(lambda: (b := _scrape(port)) and 'tp_running_jobs{team="ml-platform"} 1.0' in b and b, 60,
                          "tp metrics to count the running run")
        assert f'tp_run_utilization_percent{{device="cpu",run_id="{run_id}",team="ml-platform"}}' in body
        assert 'tp_cost_usd_total{team="ml-platform"}' in body
    finally:
        metrics.terminate()
        metrics.wait(20)
        cancelled = platform.tp("cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr[-3000:]


def test_a_servers_runs_start_warm_from_its_shared_standby(platform, tmp_path):
    """A server starts its shared standby (launch/standby.py); once it is ready, a run's agent and ranks are its
    forks, and the run trains as any other."""
    short = {"training": {"max_steps": 20, "eval_every": 10, "log_every": 10}}
    first = platform.tp("train", str(write_spec(tmp_path, "warm-first", **short)), "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    log = platform.home / standby.SHARED_LOG_FILE
    wait_until(lambda: log.is_file() and "ready in" in log.read_text(), 180, "the shared standby ready")
    proc = platform.tp("train", str(write_spec(tmp_path, "warm-second", **short)), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = last_json(proc)
    assert summary["status"] == "SUCCEEDED" and summary["final_step"] == 20
    run_dir = os.path.realpath(platform.home / "runs" / summary["run_id"])
    forked = log.read_text()
    assert "forked agent" in forked and f"in {run_dir}" in forked, forked[-2000:]
    # The standby the server started with serves its runs: their environment names no other.
    first = forked.split("standby ", 1)[1].split(":", 1)[0]
    assert {line.split("standby ", 1)[1].split(":", 1)[0] for line in forked.splitlines()} == {first}, forked[-2000:]


def _status_row(platform, run_id: str) -> dict | None:
    """The run's `tp status --json` row once it trains and its telemetry has utilization and cost; else None."""
    proc = platform.tp("status", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next((r for r in last_json(proc)["runs"] if r["run_id"] == run_id), None)
    trains = row is not None and row["status"] == "RUNNING" and row["progress"]
    return row if trains and row["utilization_pct"] is not None and row["cost_usd"] else None


def _started_from_the_code_servers_fork_server(platform, run_id: str) -> bool:
    """The run's processes descend from the warm fork server of the code server (not a freshly spawned interpreter)."""
    server = json.loads((platform.home / "server" / "server.json").read_text())
    code_server = server["processes"]["code-server"]["pid"]
    for process in processes_of(run_id):
        for ancestor in process.parents():
            if ancestor.ppid() == code_server and "multiprocessing.forkserver" in " ".join(ancestor.cmdline()):
                return True
    return False


def _scrape(port: int) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return ""


def test_the_daemon_killed_and_restarted_mid_sweep_loses_no_trial_and_runs_none_twice(platform, tmp_path):
    path = write_sweep(tmp_path, "restart-sweep", 5, 3, {"every_steps": 30, "keep_last": 1},
                       max_steps=60, eval_every=20, log_every=20)
    client = platform.spawn("sweep", str(path), "--json", log=tmp_path / "sweep.log")
    wait_until(lambda: _trials(platform, "restart-sweep").get("SUCCESS", 0) >= 1, 300, "a first finished trial")
    daemon = json.loads((platform.home / "server" / "server.json").read_text())["processes"]["daemon"]["pid"]
    os.killpg(daemon, signal.SIGKILL)
    # While no daemon runs, the trials in flight end and nothing steps the sweep or dequeues runs.
    wait_until(lambda: not {"STARTING", "STARTED"} & set(_trials(platform, "restart-sweep")), 300,
               "the trials in flight to end while the daemon is down")
    restarted = platform.tp("server", "start")
    assert restarted.returncode == 0, restarted.stderr + server_logs(platform.home)
    assert "daemon" in restarted.stderr and "code-server" not in restarted.stderr  # only what was down
    assert client.wait(600) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    summary = json.loads((tmp_path / "sweep.log").read_text().strip().splitlines()[-1])
    assert summary["trials"] == 5 and summary["fail"] == 0  # as many as without the kill
    run_ids = [row["run_id"] for row in summary["trial_table"]]
    assert len(set(run_ids)) == 5
    with platform.instance() as instance:
        for run_id in run_ids:  # each trial trained once: one Dagster run, succeeded
            runs = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": run_id}))
            assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS], run_id


def _trials(platform, sweep: str) -> dict[str, int]:
    """Dagster run status -> number of the sweep's trial runs."""
    with platform.instance() as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={"sweep": sweep}, job_name="training_pipeline"))
    return dict(Counter(r.status.value for r in runs))


def test_the_queue_tags_every_run_with_its_own_specs_team_whoever_submits_it(platform, tmp_path):
    """A submission claiming another team and priority, and a UI-style Materialize with no tags at all."""
    spec = load_spec(write_spec(tmp_path, "queue-tags", training={"max_steps": 20, "eval_every": 10},
                                resources={"procs_per_node": 1, "priority": "low"}))
    client = platform.client()
    run_id = new_run_id(spec)
    client.add_partition(run_id)
    spoofed = client.submit(TRAINING_JOB, tags={PARTITION_TAG: run_id, "team": "nlp", "dagster/priority": "10"},
                            run_config=training_run_config(spec))
    tags = client.run(spoofed).tags
    assert (tags["team"], tags["dagster/priority"], tags["owner"]) == ("ml-platform", "-10", "demo")
    assert wait_for(client, spoofed).status == "SUCCESS"
    # What the UI's Materialize button sends: the implicit asset job, the partition, no team.
    materialized = client.submit("__ASSET_JOB", tags={PARTITION_TAG: run_id}, assets=["training_run"])
    tags = client.run(materialized).tags
    assert (tags["team"], tags["dagster/priority"], tags["owner"]) == ("ml-platform", "-10", "demo")
    assert wait_for(client, materialized).status == "SUCCESS"
