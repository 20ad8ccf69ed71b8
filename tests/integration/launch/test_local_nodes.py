"""A run across two "nodes" of this machine: network namespaces with their own addresses on a bridge
(deploy/nodes/local-nodes.sh). The local launcher's rendezvous and gloo's collectives cross a real
interface; the run ends with the weights of the same world size on one node, and a preempted run
resumes on both nodes to the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.worker import job_pid, launch, train, wait, wait_for_step
from tests.integration.strategies.runs import make_spec
from training_platform.datasets import build_snapshot
from training_platform.launch import JobState
from training_platform.launch.local import LOG_FILE, LocalLauncher, local_nodes
from training_platform.launch.node_group import PORT_FILE, Node

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPT = Path(__file__).parents[3] / "deploy" / "nodes" / "local-nodes.sh"


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[Node]]:
    """Two namespace nodes: started for this module and removed after it, unless they were up already."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    already = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    # A set of its own: the Slurm cluster's nodes (tp-node*, 10.77.0.x) may be up on the other test worker.
    env = {**os.environ, "TP_NODES_NAME": "tp-lnode", "TP_NODES_PREFIX": "10.78.0"}
    up = subprocess.run([str(SCRIPT), "up", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert up.returncode == 0, up.stderr
    try:
        yield local_nodes(up.stdout.strip().removeprefix("export TP_LOCAL_NODES="))[:2]
    finally:
        if "tp-lnode0" not in already:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120, check=True, env=env)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tp-nodes")


@pytest.fixture(scope="module")
def snapshot_id(home) -> str:
    return build_snapshot("sklearn_digits", home / "snapshots").snapshot_id


def two_node_spec(home: Path, snapshot_id: str, **overrides):
    return make_spec(home, snapshot_id, "ddp", resources={"nodes": 2, "procs_per_node": 1}, **overrides)


@pytest.fixture(scope="module")
def one_node(home, snapshot_id) -> dict:
    spec = make_spec(home, snapshot_id, "ddp", resources={"nodes": 1, "procs_per_node": 2})
    return train(home, "one-node", spec)


def received_bytes(node: Node) -> int:
    shown = subprocess.run(["ip", "-n", node.namespace, "-s", "-j", "link", "show", "tp0"], capture_output=True,
                           text=True, check=True)
    return json.loads(shown.stdout)[0]["stats64"]["rx"]["bytes"]


@pytest.fixture(scope="module")
def two_nodes(home, snapshot_id, nodes) -> dict:
    before = received_bytes(nodes[1])
    result = train(home, "two-nodes", two_node_spec(home, snapshot_id), LocalLauncher(visible_gpus=0, nodes=nodes))
    return {**result, "second_node_received": received_bytes(nodes[1]) - before}


def test_two_nodes_end_with_the_weights_of_one_node_with_two_processes(home, nodes, one_node, two_nodes):
    assert two_nodes["world_size"] == one_node["world_size"] == 2 and two_nodes["final_step"] == 20
    # Bitwise: each rank gets the same CPU threads as a rank of one node with two (before, a node's one rank took
    # every core, and its sums were rounded differently in the last bit).
    assert two_nodes["final_weights_sha256"] == one_node["final_weights_sha256"]
    # The first node served the rendezvous on its own address; the second joined it there, and 20 steps of
    # gradients (9,000 parameters: 36 KB a step) reached it through its interface.
    port = int((home / "runs" / "two-nodes" / PORT_FILE).read_text())
    log = (home / "runs" / "two-nodes" / LOG_FILE).read_text()
    assert f"node_group: {nodes[0]} serves the rendezvous on port {port}; joining: {nodes[1]}" in log
    assert two_nodes["second_node_received"] > 20 * 36_000, two_nodes["second_node_received"]


def test_a_preempted_two_node_run_checkpoints_on_both_and_resumes_to_the_same_weights(
    home, snapshot_id, nodes, two_nodes, monkeypatch
):
    launcher = LocalLauncher(visible_gpus=0, nodes=nodes)
    spec = two_node_spec(home, snapshot_id, checkpoint={"every_steps": 1000})
    # The same 20 steps, each waiting 0.3 s for data, so that the preemption lands mid-run however busy the machine.
    monkeypatch.setenv("TP_SLOW_DATA_SECONDS", "0.3")
    handle = launch(home, "preempted-nodes", spec, launcher)
    wait_for_step(home, "preempted-nodes", 3)
    os.killpg(job_pid(handle), signal.SIGTERM)
    status = wait(launcher, handle)
    monkeypatch.delenv("TP_SLOW_DATA_SECONDS")
    log = (home / "runs" / "preempted-nodes" / LOG_FILE).read_text()
    assert status.state == JobState.PREEMPTED, log[-3000:]
    marker = json.loads((home / "runs" / "preempted-nodes" / "preempted.json").read_text())
    assert 3 <= marker["step"] < 20, marker
    resumed = train(home, "preempted-nodes", spec, launcher)
    assert resumed["resumed_from_step"] == marker["step"]
    assert resumed["final_weights_sha256"] == two_nodes["final_weights_sha256"]
