"""How `make test` deals modules to its workers (tests/fixtures/worker_groups.py): the Slurm group to a worker of its
own when there are three or more."""

from tests.fixtures.worker_groups import next_scope, waiting_worker

QUEUE = ["tests/unit/test_a.py", "slurm-cluster", "tests/integration/test_b.py"]


def test_the_last_of_three_workers_waits_on_the_slurm_cluster_and_two_workers_share_everything():
    assert waiting_worker(["gw0", "gw2", "gw1"]) == "gw2"
    assert waiting_worker(["gw0", "gw1", "gw2", "gw10"]) == "gw10"
    assert waiting_worker(["gw0", "gw1"]) is None


def test_the_waiting_worker_takes_the_slurm_group_and_the_others_take_the_rest_in_order():
    assert next_scope(QUEUE, for_waiting_worker=True) == "slurm-cluster"
    assert next_scope(QUEUE, for_waiting_worker=False) == "tests/unit/test_a.py"
    assert next_scope(["slurm-cluster"], for_waiting_worker=False) == "slurm-cluster"  # all that is left
    assert next_scope(["tests/unit/test_a.py"], for_waiting_worker=True) == "tests/unit/test_a.py"
