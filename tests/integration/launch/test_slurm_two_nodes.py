"""A run across two Slurm nodes: slurmds in their own network and UTS namespaces (`local-cluster.sh up --nodes 2`),
so the rendezvous (tp-nodes, on the first node's address) and gloo's collectives cross a real interface. It ends
with the weights of one node with two processes; a preempted two-node run is requeued and resumes to them, and so
does one that lost a node."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.launch.test_slurm_training_run import _finish, _run, _start_now
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState, RunRequest
from training_platform.launch.local import LocalLauncher
from training_platform.launch.slurm import SlurmConfig, SlurmLauncher
from training_platform.spec import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 400  # long enough for a preemption to land mid-run


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster):
    if "tp-node1" not in slurm_cluster.run("sinfo", "-h", "-N", "-p", "nodes", "-o", "%N").stdout:
        pytest.skip("this cluster has no namespace nodes (`local-cluster.sh up --nodes 2`, as root)")
    return slurm_cluster


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tp-slurm-nodes")
    build_snapshot("sklearn_digits", root / "snapshots")
    return root


@pytest.fixture(autouse=True)
def threads_of_shared_nodes(monkeypatch):
    """The two nodes share this machine's cores: one thread per rank, as each of one node's two ranks gets."""
    monkeypatch.setenv("TP_THREADS_PER_RANK", "1")


def _request(home: Path, run_id: str, nodes: int, partition: str | None = None) -> RunRequest:
    snapshot = next((home / "snapshots").glob("*.json")).stem
    spec = parse_spec(
        {
            "name": "slurm-nodes",
            "team": "qa",
            "owner": "ci",
            "backend": "slurm" if partition else "local",
            "dataset": {"snapshot_id": snapshot},
            "resources": {"nodes": nodes, "procs_per_node": 2 // nodes},
            "slurm": {"partition": partition} if partition else {},
            "training": {"max_steps": STEPS, "batch_size": 16, "eval_every": 100, "log_every": 10},
            "checkpoint": {"every_steps": 100, "keep_last": 2, "store_uri": str(home / "checkpoints")},
        }
    )
    return RunRequest(spec=spec, run_id=run_id, run_dir=home / "runs" / run_id, env={"TP_HOME": str(home)})


@pytest.fixture(scope="module")
def one_node(home) -> dict:
    with pytest.MonkeyPatch.context() as patch:  # the same thread per rank as the two nodes' (on any machine)
        patch.setenv("TP_THREADS_PER_RANK", "1")
        return _run(LocalLauncher(visible_gpus=0), _request(home, "one-node", nodes=1))


def _submit_until_first_checkpoint(slurm: SlurmLauncher, request: RunRequest, deadline: float, monkeypatch):
    """Submit the run with slow data (its 400 steps take 20 s or more, so what a test does next lands mid-run) and
    return its handle once its first checkpoint is durable."""
    request.write_spec()
    monkeypatch.setenv("TP_SLOW_DATA_SECONDS", "0.05")
    handle = slurm.submit(slurm.plan(request))
    monkeypatch.delenv("TP_SLOW_DATA_SECONDS")
    store = Path(request.spec.checkpoint.store_uri) / "runs" / request.run_id
    while not list(store.glob("*.json")):
        assert time.monotonic() < deadline, slurm.logs(handle)[-3000:]
        time.sleep(0.5)
    return handle


def _rendezvous_port(request: RunRequest) -> str | None:
    log = "".join(path.read_text() for path in request.run_dir.glob("slurm-*.out"))
    found = re.search(r"rendezvous tp-node0 at \S+:(\d+)", log)
    return found.group(1) if found else None


def test_a_two_node_slurm_run_ends_with_the_weights_of_one_node(home, two_nodes, one_node):
    slurm = SlurmLauncher(SlurmConfig(slurm_conf=two_nodes.slurm_conf))
    request = _request(home, "two-nodes", nodes=2, partition="nodes")
    request.write_spec()
    handle = slurm.submit(slurm.plan(request))
    port = None  # the batch script chooses it on the first node and names it in the job's log
    listening: set[str] = set()  # where the rendezvous port is served, in the first node's namespace
    while not slurm.status(handle).state.finished:
        port = port or _rendezvous_port(request)
        if port:
            shown = subprocess.run(["nsenter", "--net=/run/netns/tp-node0", "ss", "-ltnH", f"sport = :{port}"],
                                   capture_output=True, text=True, timeout=30)
            listening |= {line.split()[3] for line in shown.stdout.splitlines() if line.strip()}
        time.sleep(0.1)
    result = _finish(slurm, handle, request)
    assert result["world_size"] == 2 and result["final_step"] == STEPS
    assert result["final_weights_sha256"] == one_node["final_weights_sha256"]
    log = "".join(path.read_text() for path in request.run_dir.glob("slurm-*.out"))
    address = re.search(r"NodeAddr=(\S+)", two_nodes.run("scontrol", "show", "node", "tp-node0").stdout).group(1)
    assert f"on tp-node[0-1], rendezvous tp-node0 at {address}:{port}" in log, log[-2000:]
    # Served on the first node's own address alone (torch's c10d store listened on every interface).
    assert listening == {f"{address}:{port}"}, listening


def test_a_preempted_two_node_run_is_requeued_and_resumes_to_the_same_weights(
    home, two_nodes, one_node, tmp_path, monkeypatch
):
    """An on-demand job needs one of the two nodes a spot run holds: both nodes' ranks write the emergency
    checkpoint, the job is requeued, and its next attempt on both nodes ends bitwise where one node would."""
    slurm = SlurmLauncher(SlurmConfig(slurm_conf=two_nodes.slurm_conf))
    spot = _request(home, "spot-nodes", nodes=2, partition="nodes-spot")
    deadline = time.monotonic() + 180
    handle = _submit_until_first_checkpoint(slurm, spot, deadline, monkeypatch)
    urgent = two_nodes.run(
        "sbatch", "--parsable", "-p", "nodes", "-N", "1", "--cpus-per-task=2", f"--output={tmp_path}/urgent.out",
        "--wrap", "sleep 2",
    )
    assert urgent.returncode == 0, urgent.stderr
    status = slurm.status(handle)
    while status.state is not JobState.REQUEUED:
        assert time.monotonic() < deadline and not status.state.finished, f"{status}\n{slurm.logs(handle)[-3000:]}"
        time.sleep(0.3)
        status = slurm.status(handle)
    assert status.preemptions == 1
    _start_now(two_nodes, handle.job_id)
    resumed = _finish(slurm, handle, spot)
    log = slurm.logs(handle)
    assert "attempt 2 on tp-node[0-1]" in log and "resumed from checkpoint" in log, log[-3000:]
    assert resumed["final_weights_sha256"] == one_node["final_weights_sha256"]


def test_a_lost_node_is_reported_and_the_run_resumes_when_it_is_back(home, two_nodes, one_node, monkeypatch):
    """One node dies with no notice (its slurmd and the job's ranks there killed): the job's status names the node
    while the job still reads RUNNING, Slurm requeues it once the node is marked down, and when the node is back
    the next attempt resumes from the newest checkpoint and ends bitwise where one node would."""
    slurm = SlurmLauncher(SlurmConfig(slurm_conf=two_nodes.slurm_conf))
    request = _request(home, "lost-node", nodes=2, partition="nodes")
    deadline = time.monotonic() + 180
    handle = _submit_until_first_checkpoint(slurm, request, deadline, monkeypatch)
    try:
        failed = two_nodes.script("fail-node", "tp-node1")
        assert failed.returncode == 0, failed.stderr
        seen: dict[JobState, str] = {}
        status = slurm.status(handle)
        while JobState.REQUEUED not in seen:
            assert time.monotonic() < deadline and not status.state.finished, f"{status}\n{slurm.logs(handle)[-3000:]}"
            if status.lost_nodes:
                assert status.lost_nodes == ("tp-node1",), status
                seen.setdefault(status.state, status.reason)
            time.sleep(0.5)
            status = slurm.status(handle)
        # Reported while the job still ran (the lost node's tasks keep its step open), then as the requeue's cause.
        assert "node tp-node1 stopped answering" in seen[JobState.RUNNING], seen
        assert seen[JobState.REQUEUED].startswith("requeued after node tp-node1 failed"), seen
        restored = two_nodes.script("up")
        assert restored.returncode == 0, restored.stderr
        # Slurm's requeue hold stands (slurm_nodes.py): the next attempt starts once it ends (cred_expire, 80 s here).
        assert slurm.release_requeue_hold(handle) is None
        resumed = _finish(slurm, handle, request)
    finally:
        two_nodes.script("up")  # the node back for the tests after this one, whatever happened here
        if not slurm.status(handle).state.finished:
            slurm.cancel(handle)
    log = slurm.logs(handle)
    assert "Node failure on tp-node1" in log and "attempt 2 on tp-node[0-1]" in log, log[-3000:]
    assert "resumed from checkpoint" in log, log[-3000:]
    assert resumed["final_weights_sha256"] == one_node["final_weights_sha256"]
