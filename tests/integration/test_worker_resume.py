"""The worker under a real 2-process torchrun (gloo): exact resume from a mid-run checkpoint.

Launches start warm from a shared standby, as a `tp server`'s runs do (`warm_launches`), except in the two tests that
look at a cold start's own processes: a spot run's standby of its own, the ranks under the agent's fork server.
"""

import json
import os
import random
import signal
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.fixtures.worker import job_pid, launch, train, wait, wait_for_step, wait_until
from tests.integration.server.runs import paced_entrypoint
from training_platform.checkpoints import CheckpointManifest, CheckpointStore, open_store
from training_platform.checkpoints.interval import FIRST_AUTO_STEPS
from training_platform.checkpoints.layout import pack_key
from training_platform.checkpoints.writer import publish
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, standby
from training_platform.launch.local import LOG_FILE, LocalLauncher
from training_platform.recovery.preemption import summarize
from training_platform.runs.events import RunEvents
from training_platform.spec import CheckpointSpec, parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("warm_launches")]


@pytest.fixture
def cold_launches(monkeypatch) -> None:
    """This test's launches start cold, as outside a server: the agent, its fork server, the ranks it forks."""
    monkeypatch.delenv(standby.SHARED_OWNER_ENV)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-home")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


def _spec(home: Path, entrypoint: dict | None = None, **training):
    snapshot = next((home / "snapshots").glob("*.json")).stem
    return parse_spec(
        {
            "name": "resume",
            "team": "qa",
            "owner": "ci",
            "dataset": {"snapshot_id": snapshot},
            "training": {"max_steps": 60, "batch_size": 16, "eval_every": 20, "log_every": 5, **training},
            "checkpoint": {"every_steps": 20, "keep_last": 5, "store_uri": str(home / "checkpoints")},
        }
        | ({"entrypoint": entrypoint} if entrypoint else {})
    )


def _fork(store: CheckpointStore, manifest: CheckpointManifest, run_id: str) -> None:
    """Publish `manifest` as a checkpoint of another run (signed anew: a copied manifest is refused)."""
    publish(store.storage, manifest.model_copy(update={"run_id": run_id, "uri": "", "tier": "hot"}), store.signer)


@pytest.fixture(scope="module")
def uninterrupted(home) -> dict:
    return train(home, "straight", _spec(home))


def test_uninterrupted_run_checkpoints_and_is_deterministic(home, uninterrupted):
    assert uninterrupted["final_step"] == 60
    assert uninterrupted["world_size"] == 2
    assert [c["step"] for c in uninterrupted["checkpoints"]] == [20, 40, 60]
    again = train(home, "straight-again", _spec(home))
    assert again["final_weights_sha256"] == uninterrupted["final_weights_sha256"]
    other_seed = train(home, "other-seed", _spec(home, seed=1))
    assert other_seed["final_weights_sha256"] != uninterrupted["final_weights_sha256"]


def test_auto_interval_is_measured_agreed_by_both_ranks_and_recorded(home):
    spec = _spec(home, max_steps=600).model_copy(
        update={
            "checkpoint": CheckpointSpec(
                every_steps="auto", mtbf_seconds=0.2, keep_last=5, store_uri=str(home / "checkpoints")
            )
        }
    )
    result = train(home, "auto-interval", spec)
    events = RunEvents(home / "runs" / "auto-interval").read()
    chosen = [e for e in events if e["kind"] == "checkpoint_interval"]
    assert chosen, "no interval was chosen"
    assert result["checkpoint_interval"] == {
        k: v for k, v in chosen[-1].items() if k not in ("kind", "at", "counted_from_step")
    }
    for choice in chosen:
        assert choice["checkpoint_interval_rule"] == "young_daly" and choice["checkpoint_mtbf_seconds"] == 0.2
        assert choice["checkpoint_save_seconds"] > 0 and choice["checkpoint_step_seconds"] > 0
    steps = [e["step"] for e in events if e["kind"] == "checkpoint"]
    assert steps[0] == FIRST_AUTO_STEPS and steps[-1] == 600
    # The run finished, so both ranks saved at the same steps (every save is collective: a rank
    # that disagreed would hang the run); the main rank's events show them mostly the chosen
    # interval apart (a save right after a change of interval may be further).
    gaps = Counter(later - earlier for earlier, later in zip(steps[:-2], steps[1:-1], strict=True))
    assert gaps.most_common(1)[0][0] in {choice["checkpoint_every_steps"] for choice in chosen}, (steps, chosen)

    # Resumed from its oldest kept checkpoint, a new attempt counts from there (no cost measured yet).
    store = open_store(home / "checkpoints")
    oldest = store.list("auto-interval")[0]
    _fork(store, oldest, "auto-resumed")
    assert train(home, "auto-resumed", spec)["resumed_from_step"] == oldest.step
    resumed = [e["step"] for e in RunEvents(home / "runs" / "auto-resumed").read() if e["kind"] == "checkpoint"]
    assert resumed[0] == min(oldest.step + FIRST_AUTO_STEPS, 600), (oldest.step, resumed)


def test_resume_from_mid_run_checkpoint_is_exact(home, uninterrupted):
    # Make a run whose newest checkpoint is step 20 of the same spec, then resume it.
    store = open_store(home / "checkpoints")
    _fork(store, next(m for m in store.list("straight") if m.step == 20), "resumed")

    resumed = train(home, "resumed", _spec(home))
    assert resumed["resumed_from_step"] == 20
    assert resumed["final_weights_sha256"] == uninterrupted["final_weights_sha256"]


def test_a_run_whose_checkpoints_all_fail_to_restore_fails_and_changes_nothing(home):
    """Issue 26: it used to start over at step 0, and its retention then pruned the damaged progress."""
    train(home, "damaged", _spec(home, max_steps=40))
    store = open_store(home / "checkpoints")
    for manifest in store.list("damaged"):  # each skeleton holds its own step: a chunk of its own, zeroed
        skeleton = manifest.skeleton
        with open(home / "checkpoints" / pack_key(skeleton.pack), "r+b") as pack:
            pack.seek(skeleton.offset)
            pack.write(bytes(skeleton.size))
    manifests = {p.name: p.read_bytes() for p in (home / "checkpoints" / "runs" / "damaged").iterdir()}
    (home / "runs" / "damaged" / "result.json").unlink()

    launcher = LocalLauncher(visible_gpus=0)
    status = wait(launcher, launch(home, "damaged", _spec(home, max_steps=60), launcher))

    log = (home / "runs" / "damaged" / LOG_FILE).read_text()
    assert status.state == JobState.FAILED, log[-3000:]
    assert "run damaged has 2 checkpoints" in log and "none restores" in log and "does not start over" in log
    assert "step 40: chunk" in log and "step 20: chunk" in log
    assert {p.name: p.read_bytes() for p in (home / "checkpoints" / "runs" / "damaged").iterdir()} == manifests
    assert not (home / "runs" / "damaged" / "result.json").exists()
    events = RunEvents(home / "runs" / "damaged").read()
    retried = events[next(i for i, e in enumerate(events) if e["kind"] == "finished") + 1 :]
    assert retried and not any(e["kind"] in ("progress", "checkpoint") for e in retried)


def test_five_sigterms_at_random_steps_lose_nothing_and_resume_exactly(home, uninterrupted):
    """Preempt the same run five times at random steps (SIGTERM to the torchrun group), resume each time."""
    spec = _spec(home, max_steps=800)  # five stops of up to 40 steps plus a check interval (50) each
    launcher = LocalLauncher(visible_gpus=0)
    log = home / "runs" / "preempted" / LOG_FILE
    store = open_store(home / "checkpoints")
    rng = random.Random(5)
    preempted_at: list[int] = []
    for trial in range(5):
        handle = launch(home, "preempted", spec, launcher)
        wait_for_step(home, "preempted", (preempted_at[-1] if preempted_at else 0) + rng.randint(5, 40))
        os.killpg(job_pid(handle), signal.SIGTERM)
        status = wait(launcher, handle)
        assert status.state == JobState.PREEMPTED, f"trial {trial}: {log.read_text()[-3000:]}"
        preempted_at.append(max(m.step for m in store.list("preempted")))
        assert f"preempted at step {preempted_at[-1]}: emergency checkpoint written" in log.read_text()
    assert preempted_at == sorted(set(preempted_at)) and preempted_at[-1] < 800

    resumed = train(home, "preempted", spec)
    straight = train(home, "straight-800", spec)
    assert resumed["resumed_from_step"] == preempted_at[-1]
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
    interruptions = summarize(RunEvents(home / "runs" / "preempted").read()).interruptions
    assert [i.kind for i in interruptions] == ["preempted"] * 5
    assert [i.lost_steps for i in interruptions] == [0] * 5


def test_a_spot_runs_requeues_start_from_its_warm_standby_and_resume_exactly(home, cold_launches, tmp_path):
    """Spot runs keep a warm standby (launch/standby.py): once it is loaded, requeues are forked by it."""
    # Paced by the clock (20 ms a step) while the pace file exists: attempt 2 outlasts the standby's load however
    # busy the machine, at little CPU. Once both attempts are stopped the file goes, and the resume and the
    # reference run at full speed (the pace changes no weight).
    pace = tmp_path / "paced"
    pace.touch()
    spec = _spec(home, paced_entrypoint(pace, step_seconds=0.02), max_steps=2500).model_copy(
        update={
            "resources": _spec(home).resources.model_copy(update={"spot": True}),
            "checkpoint": _spec(home).checkpoint.model_copy(update={"every_steps": 500}),
        }
    )
    launcher = LocalLauncher(visible_gpus=0)
    run_dir = home / "runs" / "spot"
    standby_log = run_dir / standby.LOG_FILE
    preempted = 0
    for attempt in range(2):
        handle = launch(home, "spot", spec, launcher)
        wait_for_step(home, "spot", preempted + 1)
        if attempt == 1:
            # Requeued while the standby was still loading, attempt 2 started cold; the standby follows it.
            wait_until(lambda: "following attempt" in standby_log.read_text(), what="standby following attempt 2")
        os.killpg(job_pid(handle), signal.SIGTERM)
        assert wait(launcher, handle).state == JobState.PREEMPTED, (run_dir / LOG_FILE).read_text()[-3000:]
        preempted = [e["step"] for e in RunEvents(run_dir).read() if e["kind"] == "preempted"][-1]
    pace.unlink()
    resumed = train(home, "spot", spec, launcher)
    assert standby_log.read_text().count("forked agent") == 1  # the third attempt
    straight = train(home, "spot-straight", spec.model_copy(update={"resources": _spec(home).resources}))
    assert resumed["final_weights_sha256"] == straight["final_weights_sha256"]
    assert [i.lost_steps for i in summarize(RunEvents(run_dir).read()).interruptions] == [0, 0]
    # The run is over: its standby has left.
    wait_until(lambda: not standby.running(run_dir), what="standby gone after the run")


def _worker_pids(job_group: int) -> list[int]:
    """The ranks: the job's shell runs the agent, whose fork server forks the ranks."""
    import psutil

    (agent,) = psutil.Process(job_group).children()
    (server,) = [p for p in agent.children() if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    return [p.pid for p in server.children()]


def test_a_dead_rank_restarts_the_group_from_the_newest_checkpoint(home, uninterrupted, cold_launches):
    spec = _spec(home, max_steps=60)
    spec = spec.model_copy(update={"preemption": spec.preemption.model_copy(update={"max_restarts": 1})})
    launcher = LocalLauncher(visible_gpus=0)
    handle = launch(home, "rank-died", spec, launcher)
    wait_for_step(home, "rank-died", 25)
    victim = _worker_pids(job_pid(handle))[-1]
    os.kill(victim, signal.SIGKILL)
    status = wait(launcher, handle)
    log = (home / "runs" / "rank-died" / LOG_FILE).read_text()
    assert status.state == JobState.SUCCEEDED, log[-3000:]
    result = json.loads((home / "runs" / "rank-died" / "result.json").read_text())
    # The newest checkpoint when the rank died: on a busy machine the 60 steps can all be done (and the final one
    # saved) between the wait for step 25 and the kill, which then lands on the final steps' teardown.
    assert result["resumed_from_step"] in (20, 40, 60)
    assert result["final_weights_sha256"] == uninterrupted["final_weights_sha256"]
    (interruption,) = summarize(RunEvents(home / "runs" / "rank-died").read()).interruptions
    assert interruption.kind == "killed"
    assert interruption.lost_steps <= spec.checkpoint.every_steps


class _MetadataServer(BaseHTTPRequestHandler):
    """Plays the AWS instance metadata service (IMDSv2): 404 until a spot notice is posted."""

    notice = threading.Event()

    def do_PUT(self):  # noqa: N802 - http.server's naming
        self._reply(200, b"token-123")

    def do_GET(self):  # noqa: N802
        if self.path.endswith("/spot/instance-action") and self.notice.is_set():
            assert self.headers["X-aws-ec2-metadata-token"] == "token-123"
            self._reply(200, b'{"action": "terminate", "time": "2026-11-22T12:00:00Z"}')
        else:
            self._reply(404, b"")

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_spot_notice_checkpoints_and_stops_before_any_signal(home, monkeypatch):
    monkeypatch.setenv("TP_SPOT_NOTICE_HOSTS", "127.0.0.1")  # the operator allows the stand-in metadata host
    server = HTTPServer(("127.0.0.1", 0), _MetadataServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/latest/meta-data/spot/instance-action"
        spec = _spec(home, max_steps=400)
        policy = {"notice_provider": "aws", "notice_url": url, "notice_poll_seconds": 0.2}
        spec = spec.model_copy(update={"preemption": spec.preemption.model_copy(update=policy)})
        launcher = LocalLauncher(visible_gpus=0)
        handle = launch(home, "noticed", spec, launcher)
        wait_for_step(home, "noticed", 5)
        _MetadataServer.notice.set()
        status = wait(launcher, handle)
    finally:
        server.shutdown()
    assert status.state == JobState.PREEMPTED
    events = RunEvents(home / "runs" / "noticed").read()
    assert [e["kind"] for e in events].count("spot_notice") == 1
    preempted = next(e for e in events if e["kind"] == "preempted")
    assert max(m.step for m in open_store(home / "checkpoints").list("noticed")) == preempted["step"]
