"""Which spot runs make room for a job on Slurm: the ones whose preemption loses least (slurm_preemption.py)."""

from __future__ import annotations

from training_platform.checkpoints.durable import DurableCheckpoint
from training_platform.launch.slurm_cluster import ClusterInfo, Node, Partition, parse_records
from training_platform.launch.slurm_preemption import Need, RunningJob, choose_victims, running_jobs

NOW = 1_800_000_000.0
PARTITIONS = {
    "ondemand": Partition("ondemand", ("a", "b"), grace_time_s=0, preempt_mode="OFF", tier=10),
    "spot": Partition("spot", ("a", "b"), grace_time_s=120, preempt_mode="REQUEUE", tier=1),
}
ONE_SLOT = Need("ondemand", nodes=1, cpus_per_node=1, gpus_per_node=2)


def _job(job_id: str, saved_ago: float | None, *, node: str = "a", gpus: int = 2, started_ago: float = 7200.0):
    checkpoint = None if saved_ago is None else DurableCheckpoint(step=10, saved_at=NOW - saved_ago)
    return RunningJob(job_id, "spot", (node,), 1, gpus, NOW - started_ago, checkpoint)


def _node(name: str = "a", cpus: int = 0, gpus: int = 0, state: str = "ALLOCATED") -> Node:
    """A node of 2 CPUs and 4 GPUs with `cpus` and `gpus` of them free."""
    return Node(name, 2, "gpu:4", ("ondemand", "spot"), state, cpus_allocated=2 - cpus, gres_used=f"gpu:{4 - gpus}")


def _cluster(nodes: list[Node]) -> ClusterInfo:
    return ClusterInfo(partitions=PARTITIONS, nodes={node.name: node for node in nodes})


def test_the_run_that_checkpointed_a_moment_ago_goes_first():
    stale, fresh = _job("1", saved_ago=3600), _job("2", saved_ago=5)

    assert choose_victims(ONE_SLOT, _cluster([_node()]), [stale, fresh], NOW) == [fresh]
    assert choose_victims(ONE_SLOT, _cluster([_node()]), [fresh, stale], NOW) == [fresh]


def test_a_run_that_never_checkpointed_loses_its_whole_attempt():
    never = _job("1", saved_ago=None, started_ago=600)
    saved_before_this_attempt = _job("2", saved_ago=9000, started_ago=300)  # restored it, then ran 300 s
    older_save = _job("3", saved_ago=900)

    assert never.lost_seconds(NOW) == 600
    assert saved_before_this_attempt.lost_seconds(NOW) == 300
    assert choose_victims(ONE_SLOT, _cluster([_node()]), [never, older_save, saved_before_this_attempt], NOW) == [
        saved_before_this_attempt
    ]


def test_lost_work_counts_the_gpus_a_run_holds():
    big = _job("1", saved_ago=100, gpus=4)  # 400 GPU-seconds
    small = _job("2", saved_ago=150, gpus=2)  # 300 GPU-seconds

    assert choose_victims(ONE_SLOT, _cluster([_node()]), [big, small], NOW) == [small]


def test_as_many_as_needed_least_loss_first():
    jobs = [_job("1", 50, gpus=1), _job("2", 10, gpus=1), _job("3", 3000, gpus=1)]
    need = Need("ondemand", nodes=1, cpus_per_node=1, gpus_per_node=2)

    assert [j.job_id for j in choose_victims(need, _cluster([_node()]), jobs, NOW)] == ["2", "1"]


def test_nothing_is_preempted_where_the_job_fits_or_cannot_fit_at_all():
    jobs = [_job("1", 5)]
    assert choose_victims(ONE_SLOT, _cluster([_node(cpus=1, gpus=2)]), jobs, NOW) == []
    # Even with every spot run gone the node has 2 GPUs: Slurm queues the job, nobody is preempted for nothing.
    too_big = Need("ondemand", nodes=1, cpus_per_node=1, gpus_per_node=8)
    assert choose_victims(too_big, _cluster([_node()]), jobs, NOW) == []


def test_the_node_whose_runs_lose_least_is_chosen():
    on_a, on_b = _job("1", 600, node="a"), _job("2", 30, node="b")
    nodes = [_node("a"), _node("b")]

    assert choose_victims(ONE_SLOT, _cluster(nodes), [on_a, on_b], NOW) == [on_b]
    # A drained node offers no room, however cheap its runs.
    drained = [_node("a"), _node("b", state="ALLOCATED+DRAIN")]
    assert choose_victims(ONE_SLOT, _cluster(drained), [on_a, on_b], NOW) == [on_a]


def test_runs_of_an_equal_or_higher_tier_or_an_unpreemptable_partition_are_never_victims():
    ondemand_run = RunningJob("1", "ondemand", ("a",), 1, 2, NOW - 10, DurableCheckpoint(1, NOW - 1))
    assert choose_victims(ONE_SLOT, _cluster([_node()]), [ondemand_run], NOW) == []
    spot_need = Need("spot", nodes=1, cpus_per_node=1, gpus_per_node=2)
    assert choose_victims(spot_need, _cluster([_node()]), [_job("2", 5)], NOW) == []


def test_scontrol_records_are_read_as_slurm_22_05_prints_them():
    jobs = parse_records(
        "JobId=123 JobName=tp-run-a JobState=RUNNING Restarts=0 StartTime=2026-11-28T20:45:06 Partition=spot "
        "NodeList=vm NumNodes=1 NumCPUs=1 Comment=tp-checkpoint:step=5;saved_at=2026-11-28T20:00:00Z "
        "TresPerNode=gres:gpu:2\n"
        "JobId=124 JobName=wrap JobState=RUNNING StartTime=2026-11-28T20:45:09 Partition=spot NodeList=vm "
        "NumCPUs=1 Comment=(null) TresPerNode=gres:gpu:2\n"
        "JobId=125 JobName=tp-run-b JobState=PENDING StartTime=Unknown Partition=spot NodeList=(null) NumCPUs=1\n"
        "JobId=126 JobName=tp-run-c JobState=RUNNING StartTime=2026-11-28T20:46:00 Partition=spot "
        "NodeList=n[0-1] NumCPUs=4 Comment=(null) TresPerNode=gres/gpu:h100:1\n"
    )
    hostnames = {"vm": ["vm"], "n[0-1]": ["n0", "n1"]}

    found = running_jobs(jobs, hostnames.__getitem__)

    # Only the platform's running jobs: someone else's job may not requeue itself when signalled.
    assert [j.job_id for j in found] == ["123", "126"]
    assert found[0].checkpoint is not None and found[0].checkpoint.step == 5
    assert found[0].checkpoint.saved_at_iso == "2026-11-28T20:00:00Z"
    assert (found[0].cpus_per_node, found[0].gpus_per_node) == (1, 2)
    assert (found[1].nodes, found[1].cpus_per_node, found[1].gpus_per_node) == (("n0", "n1"), 2, 1)
    assert found[1].checkpoint is None and found[1].started_at > found[0].started_at

    cluster = ClusterInfo.from_records(
        parse_records("PartitionName=spot GraceTime=10 PriorityTier=1 PreemptMode=REQUEUE State=UP\n"),
        parse_records(
            "NodeName=vm CPUAlloc=2 CPUTot=2 Gres=gpu:4 GresUsed=gpu:4 State=ALLOCATED Partitions=ondemand,spot\n"
            "NodeName=n0 CPUAlloc=1 CPUTot=4 Gres=gpu:h100:8(S:0-1) GresUsed=gpu:h100:3(IDX:0-2) State=MIXED "
            "Partitions=nodes\n"
        ),
    )
    nodes = cluster.nodes.values()
    assert [(n.name, n.free_cpus, n.free_gpus(None), n.usable) for n in nodes] == [
        ("vm", 0, 0, True),
        ("n0", 3, 5, True),
    ]
    spot = cluster.partitions["spot"]
    assert (spot.tier, spot.preempt_mode, spot.grace_time_s) == (1, "REQUEUE", 10) and spot.preemptable


def test_scontrols_notice_of_an_empty_list_is_no_record():
    """scontrol answers a notice instead of records when there is nothing to show: an on-demand run's submit
    on an idle cluster asks for the running jobs, and read this notice as a malformed record."""
    assert parse_records("No jobs in the system\n") == []
    assert parse_records("No partitions in the system\n\n") == []


def test_only_the_platforms_comment_is_read_as_a_checkpoint():
    checkpoint = DurableCheckpoint(80, 1_790_000_000.0)
    assert DurableCheckpoint.from_slurm_comment(checkpoint.slurm_comment()) == checkpoint
    for other in ("(null)", "", "my notes", "tp-checkpoint:step=x;saved_at=2026-11-28T20:00:00Z", "tp-checkpoint:"):
        assert DurableCheckpoint.from_slurm_comment(other) is None
