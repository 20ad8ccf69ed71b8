"""Who may run for a team: checked in the server (the run coordinator, for whoever calls) and by `tp` before it
submits (so a refusal there is one line and nothing is created).

A user is a name of teams.yaml. The platform's admins (`admins:`) and the platform's own identity (the server's own
token, runs no person submits) may run for any team, on behalf of the spec's `owner`. Anyone else runs only for
the teams whose `members` name them, and only as themselves: the spec's `owner` must be them. A team whose
`members` is empty runs only its admins' runs, once a person asks.
"""

from __future__ import annotations

from pathlib import Path

from training_platform.errors import RightsError
from training_platform.identifiers import PLATFORM_USER
from training_platform.policy.teams import TeamsFile, declared_team, load_teams
from training_platform.spec import TrainSpec


def is_admin(user: str, home_root: Path) -> bool:
    """USER acts for every team: the platform's own identity, or a name in teams.yaml's `admins`."""
    return user == PLATFORM_USER or user in load_teams(home_root)[0].admins


def may_act_for_team(user: str, team: str | None, home_root: Path) -> bool:
    """USER may act on the runs of TEAM (cancel, delete): an admin, or a member of it. A run with no team: admins."""
    if user == PLATFORM_USER:
        return True
    teams, _ = load_teams(home_root)
    return _acts_for(user, team, teams)


def check_may_act_on_run(user: str, run_id: str, team: str | None, home_root: Path) -> None:
    """A RightsError, one line, when USER may not cancel, resume or reproduce run RUN_ID of TEAM."""
    if user == PLATFORM_USER:
        return
    teams, path = load_teams(home_root)
    if not _acts_for(user, team, teams):
        whose = f"of team {team!r}, and {user} is not a member" if team else "of no team: the platform's own"
        raise RightsError(f"{user} may not act on run {run_id}: it is a run {whose}; {_who_adds(user, teams, path)}")


def check_may_run(user: str, spec: TrainSpec, home_root: Path, continues: bool = False) -> str:
    """The owner of USER's run of SPEC (USER, or for an admin the spec's `owner`); a RightsError, one line naming
    the user, the team and who can add them, when USER may not run it. A run that `continues` a registered one (a
    resume, a reproduction: its spec is the registry's, not the request's) keeps the owner it has."""
    if user == PLATFORM_USER:
        return spec.owner  # the platform's own: its teams are checked when the run trains (preflight)
    teams, path = load_teams(home_root)  # read once for the whole check
    if spec.team not in teams.teams:
        declared_team(spec.team, home_root)  # an undeclared team: its own SpecError, naming where to declare it
    if user in teams.admins:
        return spec.owner
    if not _acts_for(user, spec.team, teams):
        raise RightsError(
            f"{user} is not a member of team {spec.team!r}, so cannot run for it; {_who_adds(user, teams, path)}, "
            "or run for your own team"
        )
    if continues:
        return spec.owner
    if spec.owner != user:
        raise RightsError(
            f"owner: {spec.owner!r} is not you ({user}): a member's runs are their own; set owner: {user} in the spec"
        )
    return user


def check_may_run_job(user: str, what: str, home_root: Path) -> None:
    """WHAT, a run that trains no team's spec (the checkpoint lifecycle, a snapshot of its own): an admin's only."""
    if not is_admin(user, home_root):
        raise RightsError(f"{user} may not run {what}: only the platform's admins do; ask one of them")


def _acts_for(user: str, team: str | None, teams: TeamsFile) -> bool:
    """USER is one of the TEAMS file's admins, or a member of TEAM (a run with no team: admins only)."""
    declared = teams.teams.get(team) if team else None
    return user in teams.admins or (declared is not None and user in declared.members)


def _who_adds(user: str, teams: TeamsFile, path: Path) -> str:
    admins = ", ".join(teams.admins) or "the platform's admins"
    return f"ask {admins} to add {user} to its members in {path}"
