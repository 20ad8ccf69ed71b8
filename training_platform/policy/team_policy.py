"""A spec may use only its own team's: checked by `preflight`, so every entry point refuses the same way.

`resolve_team` refuses a spec whose team is undeclared, whose owner is not a member, or which names
another namespace, queue, service account, Secret, Slurm account, partition or QoS than its team
declares; it returns the spec with the team's defaults filled in (the namespace, queue and service
account it runs with on Kubernetes, the account it is charged to on Slurm, its priority), so the
launchers render exactly what was checked.

A team has two Kueue LocalQueues in one ClusterQueue: its runs' and its sweep trials'. Kueue admits from them by
their recent usage (admission fair sharing, deploy/kubernetes/kueue/), so a sweep that has used much lately waits
behind the team's other runs rather than filling its quota first.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from training_platform.errors import SpecError
from training_platform.launch.slurm import SlurmConfig
from training_platform.policy.teams import Team, declared_team
from training_platform.spec import TrainSpec

SWEEP_QUEUE = "{team}-sweeps"  # a team's LocalQueue for sweep trials when its teams.yaml entry names none


def resolve_team(
    spec: TrainSpec, home_root: Path, slurm: SlurmConfig | None = None, sweep_trial: bool = False
) -> TrainSpec:
    """The spec with its team's defaults (a `sweep_trial` goes to the team's sweep queue unless it names one); a
    SpecError (one line: field, problem, fix) when it oversteps."""
    team, path = declared_team(spec.team, home_root)
    where = f"{path} (teams.{spec.team})"
    if team.members and spec.owner not in team.members:
        raise SpecError(
            f"owner: {spec.owner!r} is not a member of team {spec.team!r}; add them to its members in {where}"
        )
    k8s, allowed = spec.kubernetes, team.kubernetes
    namespace = allowed.namespace or spec.team
    queue = allowed.queue or f"{spec.team}-queue"
    sweep_queue = allowed.sweep_queue or SWEEP_QUEUE.format(team=spec.team)
    _only("kubernetes.namespace", k8s.namespace, [namespace], spec.team, where)
    _only("kubernetes.queue", k8s.queue, [queue, sweep_queue], spec.team, where)
    accounts = [allowed.service_account] if allowed.service_account else []
    _only("kubernetes.service_account", k8s.service_account, accounts, spec.team, where)
    for ref in k8s.secret_refs:
        _only("kubernetes.secret_refs", ref, allowed.secrets, spec.team, where)
    accounts = [team.slurm.account] if team.slurm.account else []
    _only("slurm.account", spec.slurm.account, accounts, spec.team, where)
    spec = _with_team_defaults(spec, team, namespace, k8s.queue or (sweep_queue if sweep_trial else queue))
    if spec.backend == "slurm":  # what the launcher derives from resources must be the team's too
        slurm = slurm or SlurmConfig()
        field = "slurm.partition" if spec.slurm.partition else "resources.spot"
        _only(field, slurm.partition_for(spec), team.slurm.partitions, spec.team, where)
        field = "slurm.qos" if spec.slurm.qos else "resources.priority"
        _only(field, slurm.qos_for(spec), team.slurm.qos, spec.team, where)
    return spec


def _only(field: str, value: str | None, allowed: Iterable[str], team: str, where: str) -> None:
    allowed = list(allowed)
    if value is None or value in allowed:
        return
    choice = f"use one of: {', '.join(allowed)}" if allowed else "remove it"
    raise SpecError(f"{field}: {value!r} is not team {team!r}'s; {choice}, or declare it in {where}")


def _with_team_defaults(spec: TrainSpec, team: Team, namespace: str, queue: str) -> TrainSpec:
    update: dict = {}
    if "priority" not in spec.resources.model_fields_set:
        update["resources"] = spec.resources.model_copy(update={"priority": team.default_priority})
    if spec.backend == "k8s":
        service_account = spec.kubernetes.service_account or team.kubernetes.service_account
        fields = {"namespace": namespace, "queue": queue, "service_account": service_account}
        update["kubernetes"] = spec.kubernetes.model_copy(update=fields)
    if spec.backend == "slurm" and team.slurm.account:
        update["slurm"] = spec.slurm.model_copy(update={"account": team.slurm.account})
    return spec.model_copy(update=update) if update else spec
