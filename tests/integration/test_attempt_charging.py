"""Every attempt is charged: a run preempted (SIGTERM) and then killed without notice (a rank dies, torchrun
restarts the group) is charged three attempts, its lost steps' dollars apart, in the ledger, the asset's
metadata, MLflow and the cost report."""

import contextlib
import json
import os
import signal
import threading
import time

import dagster as dg
import mlflow
import psutil
import pytest

from definitions import defs
from tests.fixtures.materialize import materialize_partition
from training_platform.cli.cost import summed_totals
from training_platform.cost import CostLedger, load_price_model
from training_platform.datasets import build_snapshot
from training_platform.paths import PlatformHome
from training_platform.recovery.preemption import summarize
from training_platform.runs.events import RunEvents
from training_platform.runs.specs import register_run
from training_platform.spec import parse_spec

pytestmark = pytest.mark.integration
SELECTION = ["training_run", "checkpoints"]
EVERY = 50  # steps between checkpoints


def _materialize(instance, run_id, box):
    box["result"] = materialize_partition(instance, run_id, SELECTION)


def _events_after(run_dir, job: int, timeout: float = 180):
    """Yield the event log from the `job`-th submission on, each time it grows."""
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        events = RunEvents(run_dir).read()
        submitted = [i for i, e in enumerate(events) if e["kind"] == "submitted"]
        if len(submitted) >= job and len(events) > seen:
            seen = len(events)
            yield events[submitted[job - 1]:]
        time.sleep(0.02)
    raise TimeoutError(f"job {job} of {run_dir.name} never got where the test waits")


def _fork_server(job_group: int) -> psutil.Process:
    """The job's shell runs the agent, whose fork server forks the ranks (tests/integration/test_worker_resume.py)."""
    (agent,) = psutil.Process(job_group).children()
    (server,) = [p for p in agent.children() if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    return server


def _kill_a_rank_between_checkpoints(job_group: int, run_dir) -> int | None:
    """SIGKILL the job's last rank 5-40 steps past a checkpoint's step; the step it was stopped at, or None (the job
    let go on) when it was elsewhere. The ranks run hundreds of steps a second, so the step is read with the job
    stopped (SIGSTOP on every process under the fork server): a rank is then at most 9 steps past the newest step
    it reported (every 5 steps, the newest line maybe torn), so no save of a later step can have been staged."""
    server = _fork_server(job_group)
    frozen = server.children(recursive=True)
    for process in frozen:
        process.send_signal(signal.SIGSTOP)
    try:
        reported = max(e["step"] for e in RunEvents(run_dir).read() if e["kind"] == "progress")
        if not 5 <= reported % EVERY <= 40:
            return None
        server.children()[-1].kill()  # the ranks are the fork server's own children
        return reported
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)


def test_a_run_preempted_twice_is_charged_three_attempts_with_its_lost_work_apart(instance):
    home = PlatformHome.from_env().ensure()
    snapshot = build_snapshot("sklearn_digits", home.snapshots).snapshot_id
    spec = parse_spec({
        "name": "charged", "team": "qa", "owner": "ci", "dataset": {"snapshot_id": snapshot},
        "training": {"max_steps": 400, "batch_size": 16, "eval_every": 200, "log_every": 5},
        "checkpoint": {"every_steps": EVERY, "keep_last": 10},
        "preemption": {"max_restarts": 1},  # a dead rank restarts the group within the same job
    })
    run_id = register_run(home, spec, "charged")
    run_dir = home.run_dir(run_id)
    instance.add_dynamic_partitions("training_runs", [run_id])

    first = {}
    worker = threading.Thread(target=_materialize, args=(instance, run_id, first))
    worker.start()
    for events in _events_after(run_dir, job=1):  # preemption 1: SIGTERM, an emergency checkpoint
        if any(e["kind"] == "progress" and e["step"] >= 20 for e in events):
            os.killpg(int(events[0]["job_id"].split(":")[0]), signal.SIGTERM)
            break
    worker.join(timeout=180)
    assert not first["result"].success

    second = {}
    worker = threading.Thread(target=_materialize, args=(instance, run_id, second))
    worker.start()
    for events in _events_after(run_dir, job=2):  # preemption 2: a rank dies between two checkpoints
        assert not any(e["kind"] == "finished" for e in events), "the run ended before a rank could be killed"
        steps = [e["step"] for e in events if e["kind"] == "progress"]
        if steps and steps[-1] >= 120 and 5 <= steps[-1] % EVERY <= 30:
            killed_at = _kill_a_rank_between_checkpoints(int(events[0]["job_id"].split(":")[0]), run_dir)
            if killed_at is not None:
                break
    worker.join(timeout=300)
    assert second["result"].success, RunEvents(run_dir).read()[-5:]

    rows = [r for r in CostLedger(home.root / "cost").records(run=run_id) if r["kind"] == "attempt"]
    assert [r["outcome"] for r in rows] == ["preempted", "killed", "succeeded"]
    interruptions = summarize(RunEvents(run_dir).read()).interruptions
    assert [i.lost_steps for i in interruptions] == [r["lost_steps"] for r in rows[:2]]
    # Killed 5-40 steps past a checkpoint's step: the restart resumed from that one or (its save not yet durable:
    # the writer may be a save or two behind) from an older one.
    assert rows[0]["lost_steps"] == 0 and rows[1]["lost_steps"] >= killed_at % EVERY >= 5
    assert rows[1]["lost_work_usd"] > 0 and rows[1]["badput_usd"] > rows[1]["lost_work_usd"]

    cpu = load_price_model().base_price(None, spot=False)  # on-demand CPU: one flat price
    expected = sum(r["wall_seconds"] / 3600 * 2 * cpu for r in rows)
    report = summed_totals(CostLedger(home.root / "cost").totals("run"))
    assert report["compute_usd"] == pytest.approx(expected) and report["attempts"] == 3
    assert report["lost_work_usd"] == pytest.approx(rows[1]["lost_work_usd"])

    metadata = second["result"].asset_materializations_for_node("training_run")[0].metadata
    assert (metadata["attempts"].value, metadata["preemptions"].value) == (3, 2)
    assert metadata["lost_steps"].value == rows[1]["lost_steps"]
    assert metadata["cost_lost_work_usd"].value == pytest.approx(rows[1]["lost_work_usd"])
    assert metadata["cost_total_usd"].value == pytest.approx(report["total_usd"])
    assert 0 < metadata["goodput"].value < 1
    mlflow_run = mlflow.MlflowClient(f"sqlite:///{home.root / 'mlflow.db'}").get_run(metadata["mlflow_run_id"].text)
    assert mlflow_run.data.metrics["cost_total_usd"] == pytest.approx(report["total_usd"])


def test_the_preemption_sensor_charges_attempts_that_no_asset_settled(instance):
    """A job requeued within one Dagster run, which then went away: the sensor charges the closed attempt once."""
    from sensors.preemption import preemption_sensor

    home = PlatformHome.from_env().ensure()
    run_id = register_run(home, parse_spec({"name": "orphan", "team": "qa", "owner": "ci"}), "orphan")
    now = time.time()
    log = [
        {"kind": "submitted", "at": now, "backend": "local", "job_id": f"{2**22 + 7}:/nonexistent", "spot": True},
        {"kind": "job_running", "at": now + 1, "again": False}, {"kind": "started", "at": now + 2},
        {"kind": "first_step", "at": now + 3}, {"kind": "checkpoint", "at": now + 4, "step": 10},
        {"kind": "preempted", "at": now + 5, "step": 10}, {"kind": "job_running", "at": now + 60, "again": True},
        {"kind": "started", "at": now + 61}, {"kind": "progress", "at": now + 62, "step": 15},
    ]
    (home.run_dir(run_id) / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    for _ in range(2):
        context = dg.build_sensor_context(instance=instance, resources=defs.resources, definitions=defs)
        list(preemption_sensor(context) or [])
    (row,) = CostLedger(home.root / "cost").records(run=run_id)  # the open attempt is not charged yet
    assert (row["key"], row["outcome"], row["capacity"], row["team"]) == ("orphan#1", "preempted", "spot", "qa")
    assert row["wall_seconds"] == pytest.approx(4)
