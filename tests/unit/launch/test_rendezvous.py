"""The `tp-nodes` rendezvous in a Slurm job's tasks: who hosts, on which address."""

from __future__ import annotations

import pytest

from training_platform.launch.rendezvous import NODES, _create_handler, address_towards, for_slurm_task

TASK = {"SLURM_JOB_ID": "95", "SLURMD_NODENAME": "tp-node0"}


def test_the_jobs_first_node_hosts_and_each_node_gives_the_address_it_reaches_the_host_from():
    assert for_slurm_task(NODES, "127.0.0.1:29595", "", None, {**TASK, "SLURM_NODEID": "0"}) == (
        "is_host=1", "127.0.0.1"
    )
    conf, local_addr = for_slurm_task(NODES, "127.0.0.1:29595", "read_timeout=30", None, {**TASK, "SLURM_NODEID": "1"})
    assert conf == "read_timeout=30,is_host=0" and local_addr == "127.0.0.1"


def test_what_the_command_line_gives_stays_and_other_launches_are_left_alone():
    given = {**TASK, "SLURM_NODEID": "1"}
    assert for_slurm_task(NODES, "127.0.0.1:29595", "is_host=1", "10.0.0.7", given) == ("is_host=1", "10.0.0.7")
    assert for_slurm_task("tp-loopback", "127.0.0.1:0", "", "127.0.0.1", given) == ("", "127.0.0.1")
    assert for_slurm_task(NODES, "10.77.0.1:29400", "is_host=0", "10.77.0.2", {}) == ("is_host=0", "10.77.0.2")


def test_the_address_towards_this_machine_is_its_own():
    assert address_towards("127.0.0.1") == "127.0.0.1"
    assert address_towards("localhost") in ("127.0.0.1", "::1")


def test_a_host_whose_name_resolves_to_loopback_is_refused_for_several_nodes():
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters(NODES, "localhost:0", "run-1", min_nodes=2, max_nodes=2, is_host="1")
    with pytest.raises(ValueError, match=r"localhost resolves to a loopback address.*NodeAddr"):
        _create_handler(NODES, params)
