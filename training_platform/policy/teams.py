"""The teams of a platform home: one YAML file says who may run, where, and with what budget.

``$TP_TEAMS``, else ``$TP_HOME/teams.yaml``. A spec's ``team`` must be declared there, and a spec may
use only its own team's Kubernetes namespace, Kueue queue, service account and Secrets, and its
Slurm account, partitions and QoS (``resolve_team``, called by ``preflight``). Budgets
(cost/budgets.py) read the same file. A home without the file gets one declaring the team the
examples use, so ``make demo`` runs on a fresh clone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from training_platform.errors import SpecError
from training_platform.identifiers import K8S_NAME, SLURM_NAME, USER_NAME, check_user_name

TEAMS_FILE = "teams.yaml"
TEAMS_ENV = "TP_TEAMS"
LEGACY_BUDGETS_FILE = "budgets.yaml"  # read once, when a home's teams file is first written
EXAMPLE_TEAM = "ml-platform"  # the team of every spec in examples/

_TEAM_NAME = r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$"  # TrainSpec.team's pattern
SlurmName = Annotated[str, Field(pattern=SLURM_NAME)]
K8sName = Annotated[str, Field(pattern=K8S_NAME)]
UserName = Annotated[str, Field(pattern=USER_NAME)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesAllowance(_Strict):
    """Where the team's runs go on Kubernetes: the only namespace, queue and service account they may use."""

    namespace: K8sName | None = Field(None, description="the team's namespace; default: the team name")
    queue: K8sName | None = Field(None, description="the team's Kueue LocalQueue; default: '<team>-queue'")
    sweep_queue: K8sName | None = Field(
        None,
        description="the team's LocalQueue for sweep trials (Kueue admits from the team's queues by their recent "
        "usage); default: '<team>-sweeps'",
    )
    service_account: K8sName | None = Field(
        None, description="service account of the team's pods; default: none named (the namespace's default)"
    )
    secrets: tuple[K8sName, ...] = Field((), description="Secrets (in the team's namespace) a spec may reference")


class SlurmAllowance(_Strict):
    """What the team's runs may ask of Slurm."""

    account: SlurmName | None = Field(None, description="account every run is charged to; default: the user's")
    partitions: tuple[SlurmName, ...] = Field(("spot", "ondemand"), description="partitions the team may use")
    qos: tuple[SlurmName, ...] = Field(("low", "normal", "high"), description="QoS the team may use")


class Team(_Strict):
    monthly_usd: float | None = Field(None, ge=0, description="budget in dollars per calendar month; none: no limit")
    members: tuple[str, ...] = Field(
        (), description="who may run for it, in their own name (policy/rights.py); empty: its admins only"
    )
    default_priority: Literal["low", "normal", "high"] = Field(
        "normal", description="resources.priority of a spec that sets none"
    )
    kubernetes: KubernetesAllowance = Field(default_factory=KubernetesAllowance)
    slurm: SlurmAllowance = Field(default_factory=SlurmAllowance)


class TeamsFile(_Strict):
    admins: tuple[UserName, ...] = Field(
        (), description="the platform's operators: they may act for any team; the first `tp server start` of a home "
        "writes the account that started it here"
    )
    teams: dict[Annotated[str, Field(pattern=_TEAM_NAME)], Team] = Field(
        ..., description="one entry per team, by the name specs give in `team`"
    )


def teams_path(home_root: Path) -> Path:
    return Path(os.environ.get(TEAMS_ENV) or Path(home_root) / TEAMS_FILE)


def load_teams(home_root: Path) -> tuple[TeamsFile, Path]:
    """The home's declared teams and the file they came from (written first for a new home)."""
    path = teams_path(home_root)
    if not path.is_file():
        if os.environ.get(TEAMS_ENV):
            raise SpecError(f"{TEAMS_ENV}={path} does not exist; point it at a teams file or unset it")
        seed_teams_file(Path(home_root))
    return read_teams_file(path), path


def read_teams_file(path: Path) -> TeamsFile:
    """The teams file at PATH, validated; a SpecError naming the entry to fix."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc.__class__.__name__}); fix the syntax") from None
    try:
        return TeamsFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        from training_platform.spec import format_validation_error

        raise SpecError(format_validation_error(exc, TeamsFile, str(path))) from None


def declared_team(spec_team: str, home_root: Path) -> tuple[Team, Path]:
    """The team's declaration, or a SpecError saying where to add it."""
    teams, path = load_teams(home_root)
    team = teams.teams.get(spec_team)
    if team is None:
        known = ", ".join(sorted(teams.teams)) or "(none)"
        raise SpecError(
            f"team: {spec_team!r} is not declared in {path} (declared: {known}); add it there under `teams:` "
            "or use your own team"
        )
    return team, path


def seed_teams_file(home_root: Path) -> Path:
    """Write the home's teams file: the examples' team, plus the teams of an old budgets.yaml."""
    path = Path(home_root) / TEAMS_FILE
    budgets = _legacy_budgets(Path(home_root) / LEGACY_BUDGETS_FILE)
    entries = [_entry(EXAMPLE_TEAM, budgets.pop(EXAMPLE_TEAM, None))]
    entries += [_entry(name, usd) for name, usd in sorted(budgets.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(SEED_HEADER + "teams:\n" + "".join(entries))
    os.replace(tmp, path)  # two processes seeding at once both write the same file
    return path


SEED_HEADER = """\
# The teams of this platform home (training_platform/policy/teams.py). A spec's `team` must be declared
# here, and it may use only its own team's namespace, queue, service account, Secrets, Slurm
# account, partitions and QoS. Fields left out take the defaults shown in the first entry.
admins: []                   # the platform's operators; the first `tp server start` writes its account here
"""


def _entry(name: str, monthly_usd: float | None) -> str:
    budget = "null  # no limit" if monthly_usd is None else f"{monthly_usd:g}"
    return f"""\
  {name}:
    monthly_usd: {budget}
    members: []              # who may run for it, in their own name; empty: the admins only
    default_priority: normal
    kubernetes:
      namespace: {name}
      queue: {name}-queue
      sweep_queue: {name}-sweeps  # sweep trials: Kueue admits from the two by their recent usage
      service_account: null  # the namespace's default
      secrets: []            # Secrets a spec may name in kubernetes.secret_refs
    slurm:
      account: null          # the submitting user's default account
      partitions: [spot, ondemand]
      qos: [low, normal, high]
"""


def add_first_admin(path: Path, user: str) -> bool:
    """Make USER the first admin of the teams file at PATH: True if it had none and names USER now; False if it
    names admins already (USER among them or not). The file's comments and layout are kept."""
    check_user_name(user)
    if read_teams_file(path).admins:
        return False
    lines = path.read_text().splitlines(keepends=True)
    entry = f"admins: [{user}]\n"
    at = next((i for i, line in enumerate(lines) if re.match(r"admins\s*:", line)), None)
    if at is not None:
        comment = lines[at].partition("#")[2].strip()
        lines[at] = entry if not comment else f"admins: [{user}]  # {comment}\n"
    else:
        at = next((i for i, line in enumerate(lines) if re.match(r"teams\s*:", line)), 0)
        lines.insert(at, entry)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return user in read_teams_file(path).admins


def _legacy_budgets(path: Path) -> dict[str, float]:
    """`teams: {name: {monthly_usd: N}}` of a budgets.yaml written before teams.yaml existed."""
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else None
    except yaml.YAMLError:
        raise SpecError(f"{path}: not valid YAML; fix it or remove it (teams.yaml holds budgets now)") from None
    teams = data.get("teams") if isinstance(data, dict) else None
    if not isinstance(teams, dict):
        return {}
    return {
        str(name): float(entry["monthly_usd"])
        for name, entry in teams.items()
        if isinstance(entry, dict) and isinstance(entry.get("monthly_usd"), int | float)
    }
