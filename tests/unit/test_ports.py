"""Ports for servers that are restarted on their port: below the kernel's ephemeral range, all offsets free."""

import socket
import subprocess
import sys

import pytest

from training_platform.launch import ports


def test_a_servers_ports_are_below_the_ephemeral_range_and_free():
    low, _ = ports.ephemeral_range()
    taken: set[int] = set()
    base = ports.free_listening_port((0, 1, 10000), taken)
    assert taken == {base, base + 1, base + 10000}
    assert base + 10000 < low
    assert all(ports.is_free(p) for p in taken)


def test_a_port_taken_by_a_listener_or_chosen_before_is_not_given_again():
    taken: set[int] = set()
    first = ports.free_listening_port((0,), taken)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen()
        assert not ports.is_free(first)
        for _ in range(50):
            assert ports.free_listening_port((0,), taken) != first


def test_no_room_below_the_ephemeral_range_names_the_setting(tmp_path, monkeypatch):
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("2000\t60999\n")
    monkeypatch.setattr(ports, "_LOCAL_PORT_RANGE", narrow)
    assert ports.ephemeral_range() == (2000, 60999)
    with pytest.raises(RuntimeError, match="ip_local_port_range"):
        ports.free_listening_port((0, 10000))


def test_the_module_prints_a_port_free_on_the_address_it_is_given():
    """What a Slurm job's batch script runs on its first node to choose the rendezvous port (launch/slurm.py)."""
    printed = subprocess.run([sys.executable, "-m", "training_platform.launch.ports", "127.0.0.1"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    port = int(printed)
    assert 1024 <= port < ports.ephemeral_range()[0] and ports.is_free(port, "127.0.0.1")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not ports.is_free(port, "127.0.0.1")
