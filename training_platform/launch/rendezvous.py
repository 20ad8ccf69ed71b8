"""torchrun's c10d rendezvous, listening on loopback only: for runs confined to one machine.

torchrun's c10d backend and the store it shares with the workers (TORCHELASTIC_USE_AGENT_STORE)
are TCPStores, and a TCPStore server binds every interface, whatever host it is given: asked for
`localhost:0`, it listened on `[::]` (measured with `ss -ltnp`, torch 2.13). The rendezvous
unpickles what it reads from that store, so anyone who can reach the port can run code in the
agent. This backend hands both stores a socket already bound to the endpoint's loopback address.
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta
from typing import Any

BACKEND = "tp-loopback"


def register() -> None:
    """Make `--rdzv-backend=tp-loopback` known to torchrun in this process."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)


def _create_handler(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"{BACKEND} serves one machine: give --rdzv-endpoint a loopback address, not {host}")
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    store = _loopback_store(host, port, timeout)

    class LoopbackBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # torchrun checks that the handler serves the backend it asked for
            return BACKEND

    handler = create_handler(store, LoopbackBackend(store, params.run_id), params)
    # The second store: the one the workers share through MASTER_ADDR/MASTER_PORT (torch 2.13's name).
    handler._create_tcp_store_server = lambda _addr, _port: _loopback_store(host, 0, timeout)
    return handler


def _loopback_store(host: str, port: int, timeout: timedelta) -> Any:
    from torch.distributed import TCPStore

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=1024)
    bound = listener.getsockname()[1]
    # The store owns the socket from here (it closes it): detach, so Python does not close it too.
    return TCPStore(host, bound, is_master=True, multi_tenant=True, master_listen_fd=listener.detach(), timeout=timeout)
