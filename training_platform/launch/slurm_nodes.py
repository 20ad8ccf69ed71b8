"""A Slurm job that lost a node: which of its nodes stopped answering, and whether its last attempt ended that way.

When a node dies (its slurmd and the job's ranks there), the ranks on the other nodes fail at once, but the
job step waits for the lost node's tasks: the job reads RUNNING until slurmctld marks the node DOWN after
SlurmdTimeout, then ends it NODE_FAIL and, as the job asked (`--requeue`), queues it again. slurmctld flags a
node that missed its pings (`*` after its state) well before that: that flag is how the platform tells within
a minute. After the requeue nothing in the job's record says why; srun and slurmstepd wrote it to the job's
log (`srun: error: Node failure on NODE`, `... CANCELLED ... DUE TO NODE FAILURE`).

Such a job waits out Slurm's requeue hold (about two minutes), unlike one whose attempt checkpointed on a
preemption. Started sooner, 4 of 12 new attempts here went wrong on the returned node (Slurm 22.05): once its
ranks got SIGTERM (the lost attempt's kill, which slurmctld delivers to the node once it answers, about 50 s
after marking it down; the new attempt has the same job id), three times srun waited for ever on "Requested
nodes are busy". A hold shorter than that minute (`cred_expire`) brings the first back (seen with 30 s).
"""

from __future__ import annotations

import re
from pathlib import Path

from training_platform.launch.slurm_cluster import SlurmCommands

# Base states of a node that runs nothing; `*` after any state: the node missed slurmctld's pings.
_DEAD_STATES = frozenset({"down", "fail", "failing"})
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
_CANCELLED_BY_NODE_FAILURE = "DUE TO NODE FAILURE"
# The batch script's first line in every attempt (slurm.py render_sbatch).
_ATTEMPT_START = re.compile(r"^tp: job \d+ attempt \d+ ", re.MULTILINE)
LOG_TAIL_BYTES = 256 * 1024


def unresponsive_nodes(commands: SlurmCommands, nodelist: str) -> list[str]:
    """The nodes of `nodelist` (a Slurm hostlist, e.g. `tp-node[0-1]`) that stopped answering or are down."""
    if not nodelist or nodelist == "(null)":
        return []
    result = commands.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N %T"], check=False)
    if result.returncode != 0:
        return []  # slurmctld busy: the next poll asks again
    lost: list[str] = []
    for line in result.stdout.splitlines():
        name, _, state = line.strip().partition(" ")  # a node in two partitions is listed twice
        if name and name not in lost and (state.endswith("*") or state.rstrip("*~#!%$@^-") in _DEAD_STATES):
            lost.append(name)
    return lost


def last_attempt_log(path: Path) -> str:
    """What the job's current (or, while it is requeued, its last) attempt wrote to the job's log."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(0, size - LOG_TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    starts = list(_ATTEMPT_START.finditer(text))
    return text[starts[-1].start() :] if starts else text


def nodes_lost_in(attempt_log: str) -> list[str] | None:
    """The nodes whose failure ended this attempt ([] when Slurm did not name them); None: no node failed."""
    names = list(dict.fromkeys(_NODE_FAILURE.findall(attempt_log)))
    if names or _CANCELLED_BY_NODE_FAILURE in attempt_log:
        return names
    return None
