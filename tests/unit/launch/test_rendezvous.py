"""The `tp-nodes` rendezvous in a Slurm job's tasks: who hosts, on which address."""

from __future__ import annotations

import pytest

from training_platform.launch.rendezvous import (
    LOOPBACK,
    NODES,
    _create_handler,
    address_towards,
    calling_function,
    for_slurm_task,
    register,
)

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


def test_each_rendezvous_event_is_named_by_the_method_that_records_it_as_torch_names_it(monkeypatch):
    from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous

    register()
    assert dynamic_rendezvous.get_method_name is calling_function  # not inspect.stack(), which reads every source
    names: list[str] = []
    monkeypatch.setattr(dynamic_rendezvous, "construct_and_record_rdzv_event", lambda name, **_: names.append(name))
    handler = _create_handler(LOOPBACK, RendezvousParameters(LOOPBACK, "127.0.0.1:0", "run-1", 1, 1))
    try:
        handler.next_rendezvous()
    finally:
        handler.shutdown()
    # The names torch's own inspect.stack()[2].function gives: the method that called _record.
    assert "DynamicRendezvousHandler.next_rendezvous" in names and "DynamicRendezvousHandler._close" in names
    assert "_DistributedRendezvousOpExecutor.run" in names


def test_a_name_asked_for_beyond_the_stack_is_torchs_placeholder():
    assert calling_function(10_000) == "no_method_name"
