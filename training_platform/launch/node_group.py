"""`python -m training_platform.launch.node_group --node NS=ADDR ... -- AGENT ARGV`: one agent per node.

The local launcher's multi-node job. Each "node" is a network namespace with its own address
(deploy/nodes/local-nodes.sh), so the rendezvous and the collectives cross a real interface. The
first node serves the rendezvous on its own address alone (`tp-nodes`, rendezvous.py), on a port
the kernel picks and the agent writes to a file; the other nodes join once it listens.

SIGTERM and SIGINT reach every node's agent (each writes its emergency checkpoint). A node whose agent
fails takes the group down, since its peers would otherwise wait for it until their collectives time
out; the group exits with the first failure's code.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from training_platform.launch.rendezvous import NODES, PORT_FILE_ENV

PORT_FILE = "rendezvous_port"
NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
LISTEN_TIMEOUT_S = 120.0
# Peers of a failed node get this long after SIGTERM to leave before SIGKILL (a collective that waits for the
# dead node does not end on its own).
PEER_GRACE_S = 30.0


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str

    @classmethod
    def parse(cls, text: str, where: str = "--node") -> Node:
        """`NAMESPACE=ADDRESS`, both checked: they reach a command line run as root."""
        namespace, _, address = text.partition("=")
        if not NAMESPACE.match(namespace):
            raise ValueError(f"{where}: {text!r} is not NAMESPACE=ADDRESS (a network namespace name, e.g. tp-node0)")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"{where}: {text!r} has no IP address after '=' (e.g. tp-node0=10.77.0.1)") from None
        return cls(namespace, address)

    def __str__(self) -> str:
        return f"{self.namespace}={self.address}"


def agent_argv(agent: list[str], node: Node, nodes: int, endpoint: str, is_host: bool) -> list[str]:
    """The agent's command on NODE: its flags for this node inserted before the worker's `-m`."""
    at = agent.index("-m", agent.index("-m") + 1)  # the first -m starts the agent, the second the worker
    flags = [
        f"--nnodes={nodes}",
        f"--rdzv-backend={NODES}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-conf=is_host={int(is_host)}",
        f"--local-addr={node.address}",
    ]
    return [_ip(), "netns", "exec", node.namespace, *agent[:at], *flags, *agent[at:]]


def _endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _ip() -> str:
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if ip is None:
        raise SystemExit("node_group: the ip command (iproute2) is missing; apt-get install iproute2")
    return ip


class Group:
    def __init__(self, nodes: list[Node], agent: list[str]):
        self.nodes, self.agent = nodes, agent
        self.procs: list[subprocess.Popen] = []
        self.first_failure: int | None = None
        self.signalled = False

    def forward(self, signum: int) -> None:
        """A signal to the job (a preemption, a cancel): every node's agent gets it, once."""
        self.signalled = True
        self.signal_all(signum)

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def start(self) -> None:
        port_file = Path.cwd() / PORT_FILE
        port_file.unlink(missing_ok=True)
        head = self.nodes[0]
        env = {**os.environ, PORT_FILE_ENV: str(port_file)}
        first = agent_argv(self.agent, head, len(self.nodes), _endpoint(head.address, 0), True)
        self.procs.append(subprocess.Popen(first, env=env))
        port = self._listening_port(port_file)
        endpoint = _endpoint(head.address, port)
        joining = ", ".join(str(node) for node in self.nodes[1:])
        print(f"node_group: {head} serves the rendezvous on port {port}; joining: {joining}", flush=True)
        for node in self.nodes[1:]:
            self.procs.append(subprocess.Popen(agent_argv(self.agent, node, len(self.nodes), endpoint, False)))

    def _listening_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while not port_file.is_file():
            if self.procs[0].poll() is not None:
                raise SystemExit(self.procs[0].returncode or 1)
            if time.monotonic() > deadline:
                self.signal_all(signal.SIGKILL)
                raise SystemExit(f"node_group: the first node's agent did not listen within {LISTEN_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        return int(port_file.read_text())

    def wait(self) -> int:
        """Until every agent has left; a failed one's peers are stopped."""
        failed_at: float | None = None
        while any(proc.poll() is None for proc in self.procs):
            for proc in self.procs:
                if proc.returncode not in (None, 0) and self.first_failure is None:
                    self.first_failure, failed_at = proc.returncode, time.monotonic()
                    if not self.signalled:  # a second SIGTERM would cut short an agent's own stop
                        self.signal_all(signal.SIGTERM)
            if failed_at is not None and time.monotonic() - failed_at > PEER_GRACE_S:
                self.signal_all(signal.SIGKILL)
            time.sleep(0.1)
        if self.first_failure is None:
            self.first_failure = next((p.returncode for p in self.procs if p.returncode), 0)
        return self.first_failure


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: node_group --node NS=ADDR [--node NS=ADDR ...] -- AGENT ARGV")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="node_group")
    parser.add_argument("--node", action="append", required=True, help="NAMESPACE=ADDRESS, the first hosts")
    args = parser.parse_args(argv[:split])
    try:
        nodes = [Node.parse(text) for text in args.node]
    except ValueError as exc:
        raise SystemExit(f"node_group: {exc}") from None
    group = Group(nodes, argv[split + 1 :])
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _frame: group.forward(s))
    group.start()
    return group.wait()


if __name__ == "__main__":
    sys.exit(main())
