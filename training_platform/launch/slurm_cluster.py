"""What a Slurm cluster offers, read from `scontrol`, and whether a job's request fits it.

`sacct` needs an accounting database that many small clusters (and our local test cluster)
do not run, so everything here uses `scontrol`, which only needs slurmctld.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from training_platform.errors import LaunchError, SpecError

# Keys of `scontrol -o` output: values may contain spaces (Command=, WorkDir=), keys never do.
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as a mapping of its fields; empty for a line of none (a notice)."""
    matches = list(_KEY.finditer(line))
    ends = [following.start() for following in matches[1:]] + [len(line)] if matches else []
    return {match.group(1): line[match.end() : end].strip() for match, end in zip(matches, ends, strict=True)}


def parse_records(text: str) -> list[dict[str, str]]:
    """The records of `scontrol show ... -o`: none for its notice of an empty list ("No jobs in the system")."""
    return [record for line in text.splitlines() if (record := parse_scontrol_record(line))]


def gpus_in_gres(gres: str, gres_type: str | None) -> int:
    """GPUs of `gres_type` (any type when None) in a node's Gres field, e.g. `gpu:h100:8(S:0-1),gpu:2`."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        parts = re.sub(r"\(.*\)", "", item).strip().split(":")
        if not parts or parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        kind = parts[1] if len(parts) == 3 else None
        if count.isdigit() and (gres_type is None or kind == gres_type):
            total += int(count)
    return total


class SlurmCommands:
    """Runs Slurm's client commands; a missing client or a refusal becomes a LaunchError."""

    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 30.0) -> None:
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s

    def env(self, extra: Mapping[str, str] | None = None, inherit: bool = True) -> dict[str, str]:
        env = {**(os.environ if inherit else {}), **(extra or {})}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def run(
        self, args: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = True, inherit: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command; `inherit=False`: with `env` alone (and SLURM_CONF), for sbatch's job."""
        command_env = self.env(env, inherit)
        conf = command_env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():  # a client would retry reading it for 60 s, then fail
            raise LaunchError(
                f"SLURM_CONF names {conf}, which is not a file: start the local cluster "
                "(`deploy/slurm/local-cluster.sh up`), or set SLURM_CONF (the Slurm launcher's slurm_conf) to the "
                "slurm.conf of your cluster"
            )
        try:
            result = subprocess.run(list(args), capture_output=True, text=True, env=command_env, timeout=self.timeout_s)
        except FileNotFoundError:
            raise LaunchError(
                f"`{args[0]}` is not installed here; install the Slurm clients, or start the local cluster "
                "with `deploy/slurm/local-cluster.sh up`"
            ) from None
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"`{' '.join(args)}` did not answer within {self.timeout_s:.0f}s; check that slurmctld runs "
                "(`scontrol ping`)"
            ) from None
        if check and result.returncode != 0:
            raise LaunchError(
                f"`{' '.join(args)}` failed (exit {result.returncode}): {result.stderr.strip()}\n"
                "check that slurmctld answers (`scontrol ping`) and that SLURM_CONF names its config"
            )
        return result


# Node states (their words, lower case) that run no new job: room there does not count.
_UNUSABLE_NODE_STATES = ("down", "drain", "fail", "future", "maint", "reboot", "power", "unknown", "not_responding")


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    grace_time_s: int
    preempt_mode: str
    tier: int = 0  # PriorityTier: a higher tier's jobs may preempt a lower one's (preempt/partition_prio)

    @property
    def preemptable(self) -> bool:
        return self.preempt_mode.upper() not in ("", "OFF")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    gres: str
    partitions: tuple[str, ...]
    state: str = "IDLE"
    cpus_allocated: int = 0
    gres_used: str = ""  # the GPUs its jobs hold (`scontrol show node -d`)

    @property
    def free_cpus(self) -> int:
        return self.cpus - self.cpus_allocated

    def free_gpus(self, gres_type: str | None) -> int:
        return gpus_in_gres(self.gres, gres_type) - gpus_in_gres(self.gres_used, gres_type)

    @property
    def usable(self) -> bool:
        """Whether the node may start a job now (not down, drained, failing or powered off)."""
        words = self.state.lower().replace("+", " ").split()
        return bool(words) and not any(w.rstrip("*~#!%$@^-").startswith(_UNUSABLE_NODE_STATES) for w in words)


@dataclass(frozen=True)
class ClusterInfo:
    partitions: dict[str, Partition]
    nodes: dict[str, Node]

    @classmethod
    def query(cls, commands: SlurmCommands) -> ClusterInfo:
        partitions = parse_records(commands.run(["scontrol", "show", "partition", "-o"]).stdout)
        # -d: each node's GresUsed, the GPUs its jobs hold.
        nodes = parse_records(commands.run(["scontrol", "show", "node", "-d", "-o"]).stdout)
        return cls.from_records(partitions, nodes)

    @classmethod
    def from_records(cls, partitions: list[dict[str, str]], nodes: list[dict[str, str]]) -> ClusterInfo:
        node_map = {
            n["NodeName"]: Node(
                name=n["NodeName"],
                cpus=int_field(n.get("CPUTot")),
                gres=n.get("Gres", ""),
                partitions=tuple(p for p in n.get("Partitions", "").split(",") if p),
                state=n.get("State", ""),
                cpus_allocated=int_field(n.get("CPUAlloc")),
                gres_used=n.get("GresUsed", ""),
            )
            for n in nodes
            if "NodeName" in n
        }
        part_map = {}
        for p in partitions:
            if "PartitionName" not in p:
                continue
            name = p["PartitionName"]
            members = tuple(n.name for n in node_map.values() if name in n.partitions)
            part_map[name] = Partition(
                name=name,
                nodes=members,
                grace_time_s=int_field(p.get("GraceTime")),
                preempt_mode=p.get("PreemptMode", ""),
                tier=int_field(p.get("PriorityTier")),
            )
        return cls(partitions=part_map, nodes=node_map)

    def preemptable_by(self, partition: str) -> set[str]:
        """The partitions whose jobs a job of `partition` may preempt: lower tiers that allow preemption."""
        target = self.partitions.get(partition)
        if target is None:
            return set()
        return {p.name for p in self.partitions.values() if p.preemptable and p.tier < target.tier}

    def check(self, requirements: Mapping[str, object]) -> None:
        """Refuse a request this cluster can never run, naming the spec field and the fix."""
        partition = str(requirements["partition"])
        field = str(requirements.get("partition_field", "slurm.partition"))
        if partition not in self.partitions:
            known = ", ".join(sorted(self.partitions)) or "(none)"
            raise SpecError(
                f"{field}: Slurm partition {partition!r} does not exist on this cluster (partitions: {known}); "
                "set slurm.partition to one of them, or fix the launcher's partition map"
            )
        members = [self.nodes[name] for name in self.partitions[partition].nodes]
        nodes = int(requirements["nodes"])  # type: ignore[call-overload]
        if nodes > len(members):
            raise SpecError(
                f"resources.nodes: {nodes} nodes requested but partition {partition!r} has {len(members)}; "
                "lower resources.nodes or choose a bigger partition"
            )
        gpus = int(requirements.get("gpus_per_node", 0))  # type: ignore[call-overload]
        gres_type = requirements.get("gres_type")
        if gpus:
            most = max((gpus_in_gres(n.gres, gres_type) for n in members), default=0)  # type: ignore[arg-type]
            kind = f" of type {gres_type!r}" if gres_type else ""
            offers = ", ".join(sorted({n.gres for n in members if n.gres})) or "no GPUs"
            if gpus > most:
                raise SpecError(
                    f"resources.gpus_per_node: {gpus} GPUs{kind} per node requested but the nodes of partition "
                    f"{partition!r} have at most {most} (they offer: {offers}); lower resources.gpus_per_node"
                    + (" or change resources.gpu_type" if gres_type else "")
                )
        cpus = int(requirements.get("cpus_per_node", 1))  # type: ignore[call-overload]
        most_cpus = max((n.cpus for n in members), default=0)
        if cpus > most_cpus:
            raise SpecError(
                f"resources.procs_per_node: needs {cpus} CPUs per node but the nodes of partition {partition!r} "
                f"have at most {most_cpus}; lower resources.procs_per_node"
            )


def int_field(text: str | None) -> int:
    """A count field of scontrol's records; 0 when absent or not a number (`N/A`, `UNLIMITED`)."""
    return int(text) if text and text.isdigit() else 0
