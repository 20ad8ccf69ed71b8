"""torchrun's c10d rendezvous, with its stores bound to the one address they serve.

torchrun's c10d backend and the store it shares with the workers (TORCHELASTIC_USE_AGENT_STORE)
are TCPStores, and a TCPStore server binds every interface, whatever host it is given: asked for
`localhost:0`, it listened on `[::]` (measured with `ss -ltnp`, torch 2.13). The rendezvous
unpickles what it reads from that store, so anyone who can reach the port can run code in the
agent. These backends hand each store a socket already bound to one address:

- `tp-loopback`, for a run confined to one machine: the endpoint must be a loopback address.
- `tp-nodes`, for several nodes (deploy/nodes/local-nodes.sh, a Slurm job's nodes): the node started
  with `--rdzv-conf=is_host=1` serves the rendezvous on the endpoint's address alone, the others connect
  to it; the workers' store is served on the address of the node that ranks first (`--local-addr`).
  In a Slurm job's task the agent fills both in (`for_slurm_task`): the job's first node hosts, and each
  node's address is the one it reaches the host from.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

LOOPBACK = "tp-loopback"
NODES = "tp-nodes"
# Where the hosting node writes the port it listens on, when its endpoint asks for any port (`ADDR:0`).
PORT_FILE_ENV = "TP_RDZV_PORT_FILE"


def register() -> None:
    """Make `--rdzv-backend=tp-loopback` and `tp-nodes` known to torchrun in this process."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous, rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK, lambda params: _create_handler(LOOPBACK, params))
    rendezvous_handler_registry.register(NODES, lambda params: _create_handler(NODES, params))
    # The rendezvous names each event it records by its caller, found with inspect.stack() (twice), which reads
    # the source of every frame on the stack: 0.7 s of each agent's CPU, a fifth of a warm run's start.
    dynamic_rendezvous.get_method_name = calling_function


def calling_function(depth: int = 2) -> str:
    """The name of the function DEPTH frames up from this call, as torch's get_method_name answers it."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack not that deep
        return "no_method_name"


def _create_handler(backend: str, params: Any) -> Any:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    if backend == LOOPBACK:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"{LOOPBACK} serves one machine: give --rdzv-endpoint a loopback address, not {host}")
        store = _bound_store(host, port, timeout)
    elif params.get_as_bool("is_host", False):
        if params.max_nodes > 1 and _resolves_to_loopback(host):
            raise ValueError(
                f"{NODES}: the rendezvous host {host} resolves to a loopback address here, which the other nodes "
                "cannot reach (Debian's /etc/hosts maps a machine's own name to 127.0.1.1); give the endpoint the "
                "node's network address (on Slurm: NodeAddr in slurm.conf)"
            )
        port_file = os.environ.get(PORT_FILE_ENV)
        if not port and not port_file:
            raise ValueError(f"{NODES}: give --rdzv-endpoint a port the other nodes connect to, or {PORT_FILE_ENV}")
        store = _bound_store(host, port, timeout)
        if port_file:  # node_group.py starts the other nodes' agents once it names the port
            staged = Path(f"{port_file}.tmp")
            staged.write_text(str(store.port))
            staged.replace(port_file)
    else:
        store = TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)

    class BoundBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # torchrun checks that the handler serves the backend it asked for
            return backend

    handler = create_handler(store, BoundBackend(store, params.run_id), params)
    # The second store, the workers' (MASTER_ADDR/MASTER_PORT; torch 2.13's name): served by the node that ranks
    # first, on that node's own address.
    handler._create_tcp_store_server = lambda addr, _port: _bound_store(addr, 0, timeout)
    return handler


def _bound_store(host: str, port: int, timeout: timedelta) -> Any:
    from torch.distributed import TCPStore

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=1024)
    bound = listener.getsockname()[1]
    # The store owns the socket from here (it closes it): detach, so Python does not close it too.
    return TCPStore(host, bound, is_master=True, multi_tenant=True, master_listen_fd=listener.detach(), timeout=timeout)


def for_slurm_task(backend: str, endpoint: str, conf: str, local_addr: str | None, environ: Mapping[str, str]):
    """The rendezvous settings of one node's agent in a Slurm job step (one task per node): the job's first node
    (SLURM_NODEID 0) hosts, and a node's address is the one it reaches the host from. Anything given stays."""
    if backend != NODES or "SLURM_NODEID" not in environ:
        return conf, local_addr
    if "is_host" not in conf:
        conf = ",".join(filter(None, [conf, f"is_host={int(environ['SLURM_NODEID'] == '0')}"]))
    if not local_addr:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

        local_addr = address_towards(parse_rendezvous_endpoint(endpoint, default_port=0)[0])
    return conf, local_addr


def address_towards(host: str) -> str:
    """This machine's address on the route to HOST (its own address, when HOST is this machine)."""
    family, *_, target = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # a UDP connect sends nothing: it only picks the route, and so the source address
        return probe.getsockname()[0]


def _resolves_to_loopback(host: str) -> bool:
    return any(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
