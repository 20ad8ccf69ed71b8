"""Checkpoint-aware preemption on Slurm: the platform picks which spot runs make room, by the work they would lose.

Slurm's preemption plugins order the jobs they may preempt by partition tier and size (preempt/partition_prio)
or QoS (preempt/qos), never by a job's own priority, and among equals they take the oldest. So before an
on-demand run is submitted where it does not fit, the launcher chooses the platform's spot runs whose
preemption loses least (the time since each one's last durable checkpoint, read from its job comment, times
the GPUs, or CPUs, it holds), signals them as Slurm's time limit would (each writes an emergency checkpoint
and requeues itself) and holds the new job back until they have left. A run that checkpointed a moment ago
goes first; one that saved an hour ago keeps running.

The new job is held with a begin time (`sbatch --begin`), released as soon as its room is free: if the
launcher dies in between, the hold runs out by itself and Slurm's own preemption takes over. Jobs that are
not the platform's (their name lacks the `tp-` prefix the launcher gives) are never signalled: they may not
requeue themselves, so making room with them is left to Slurm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from training_platform.checkpoints.durable import DurableCheckpoint
from training_platform.launch.slurm_cluster import ClusterInfo, Node, gpus_in_gres, int_field

JOB_NAME_PREFIX = "tp-"  # render_sbatch names every job tp-<run_id>


@dataclass(frozen=True)
class Need:
    """What a job asks of each of its nodes, in one partition."""

    partition: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    gres_type: str | None = None


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    partition: str
    nodes: tuple[str, ...]
    cpus_per_node: int
    gpus_per_node: int
    started_at: float  # this attempt's start, seconds since the epoch
    checkpoint: DurableCheckpoint | None  # the last durable one its comment names

    def lost_seconds(self, now: float) -> float:
        """Seconds of work a preemption would destroy now: everything since the newer of this attempt's start
        and its last durable checkpoint (an attempt restores the checkpoint it started from, no newer one)."""
        safe = max(self.started_at, self.checkpoint.saved_at if self.checkpoint else 0.0)
        return max(0.0, now - safe)

    def lost_work(self, now: float) -> float:
        """GPU-seconds a preemption would destroy now (CPU-seconds for a job without GPUs)."""
        units = self.gpus_per_node or self.cpus_per_node
        return self.lost_seconds(now) * max(1, units) * max(1, len(self.nodes))


def choose_victims(need: Need, cluster: ClusterInfo, jobs: Sequence[RunningJob], now: float) -> list[RunningJob]:
    """The running platform jobs to preempt so that `need` starts, losing the least work; [] when it fits as
    things are, or when even preempting them all would not make room (Slurm decides then)."""
    preemptable = cluster.preemptable_by(need.partition)
    costs: list[tuple[float, int, str, list[RunningJob]]] = []
    for node in cluster.nodes.values():
        if need.partition not in node.partitions or not node.usable:
            continue
        on_node = [job for job in jobs if node.name in job.nodes and job.partition in preemptable]
        picked = _cheapest_room(need, node, on_node, now)
        if picked is not None:
            costs.append((sum(job.lost_work(now) for job in picked), len(picked), node.name, picked))
    if len(costs) < need.nodes:
        return []
    chosen = sorted(costs, key=lambda c: c[:3])[: need.nodes]
    victims: dict[str, RunningJob] = {}
    for *_, picked in chosen:
        victims.update((job.job_id, job) for job in picked)
    return list(victims.values())


def _cheapest_room(need: Need, node: Node, candidates: Iterable[RunningJob], now: float) -> list[RunningJob] | None:
    """The jobs on `node` to preempt, least lost work first, until `need` fits there; None if it cannot."""
    cpus, gpus = node.free_cpus, node.free_gpus(need.gres_type)
    picked: list[RunningJob] = []
    # Ties: the youngest first (the least of its attempt to redo if its checkpoint is as old as its start).
    for job in sorted(candidates, key=lambda j: (j.lost_work(now), -j.started_at)):
        if cpus >= need.cpus_per_node and gpus >= need.gpus_per_node:
            break
        picked.append(job)
        cpus += job.cpus_per_node
        gpus += job.gpus_per_node
    return picked if cpus >= need.cpus_per_node and gpus >= need.gpus_per_node else None


# ----- reading scontrol's records --------------------------------------------------------------
def running_jobs(records: Iterable[dict[str, str]], hostnames: Callable[[str], list[str]]) -> list[RunningJob]:
    """The platform's running jobs among `scontrol show job -o` records; `hostnames(nodelist)` expands a
    Slurm hostlist (`tp-node[0-1]`) into names."""
    jobs = []
    for record in records:
        if record.get("JobState") != "RUNNING" or not record.get("JobName", "").startswith(JOB_NAME_PREFIX):
            continue
        nodes = tuple(hostnames(record.get("NodeList", "")))
        count = max(1, len(nodes))
        jobs.append(
            RunningJob(
                job_id=record["JobId"],
                partition=record.get("Partition", ""),
                nodes=nodes,
                cpus_per_node=int_field(record.get("NumCPUs")) // count,
                gpus_per_node=gpus_in_gres(_gres(record.get("TresPerNode", "")), None),
                started_at=_slurm_time(record.get("StartTime", "")),
                checkpoint=DurableCheckpoint.from_slurm_comment(record.get("Comment", "")),
            )
        )
    return jobs


def _gres(tres_per_node: str) -> str:
    """`gres:gpu:2` (Slurm 22.05) or `gres/gpu:2` (later) as a node's Gres field reads: `gpu:2`."""
    return ",".join(
        item.split(":", 1)[1] if item.startswith("gres:") else item.removeprefix("gres/")
        for item in tres_per_node.split(",")
        if item
    )


def _slurm_time(text: str) -> float:
    """A Slurm timestamp (slurmctld's local time, no zone) as seconds since the epoch; 0 when unknown."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0
