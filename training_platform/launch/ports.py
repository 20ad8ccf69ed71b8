"""Ports for servers that may be restarted on the port they had: below the kernel's ephemeral range.

While such a server is down, a port in the ephemeral range can be handed to an outgoing connection as
its local port, or to a client that keeps dialling the port itself (TCP's simultaneous open connects it
to itself). The restarted server then fails with "address already in use": seen with SeaweedFS, whose
own parts retry their master while it starts.

    python -m training_platform.launch.ports [HOST]   prints such a port free on HOST (a Slurm job's rendezvous)
"""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

_LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # above the well-known and most registered ports that other software listens on


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in _LOCAL_PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def free_listening_port(offsets: Iterable[int] = (0,), taken: set[int] | None = None, host: str = "127.0.0.1") -> int:
    """A port P, below the ephemeral range, with P + each offset free on HOST (and not in `taken`, which gets them).

    `offsets` serves servers that listen on several ports at fixed distances (SeaweedFS: its gRPC port is
    its HTTP port + 10000).
    """
    offsets = sorted(set(offsets))
    taken = set() if taken is None else taken
    low, _ = ephemeral_range()
    lowest = _LOWEST if low - offsets[-1] - _LOWEST > 1000 else 1024
    highest = low - offsets[-1] - 1
    if highest <= lowest:
        raise RuntimeError(
            f"no room for a server's ports below the ephemeral range ({low}-): "
            f"raise net.ipv4.ip_local_port_range's lower bound"
        )
    for _ in range(1000):
        port = random.randint(lowest, highest)
        ports = {port + offset for offset in offsets}
        if not ports & taken and all(is_free(p, host) for p in ports):
            taken |= ports
            return port
    raise RuntimeError(f"no free ports between {lowest} and {low}; too many servers listen there")


if __name__ == "__main__":
    print(free_listening_port(host=sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"))
