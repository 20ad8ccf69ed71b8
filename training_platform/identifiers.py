"""Identifiers that become paths, script lines or API object names: one pattern each, checked where
they enter, and paths that must stay under their root.

A run id is a Dagster partition key, which accepts anything (`../../x`, `/tmp/x`); a Slurm partition
is written into an `#SBATCH` line, where a newline starts a command. Neither is trusted until checked.
"""

from __future__ import annotations

import re
from pathlib import Path

from training_platform.errors import SpecError

# Run ids: `<name>-<stamp>-<hex>`, `<name>-<day>`, sweep trials; one path component, never `..`.
RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# Slurm partitions, QoS and accounts: one word, nothing a shell or sbatch would read as syntax.
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Kubernetes namespaces, service accounts, LocalQueues and Secrets: a DNS-1123 label.
K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Users of the platform (teams.yaml's admins and members, token owners, a run's owner): a login name as POSIX
# systems spell one, so the first admin can be the account that started the server.
USER_NAME = r"^[a-z_][a-z0-9_.-]{0,31}$"
# The platform's own identity: the server's own token (its account's `tp`), and runs no person submits. A valid user
# name, reserved: no token for a person is made under it (server/tokens.py).
PLATFORM_USER = "_platform"

_RUN_ID = re.compile(RUN_ID)
_USER_NAME = re.compile(USER_NAME)


def check_run_id(run_id: str, what: str = "run id", fix: str = "pick another partition key") -> str:
    """`run_id` itself, or a SpecError naming it, the allowed form and `fix` (`what`: a sweep name, ...)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise SpecError(
            f"{what} {run_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit (no '/', no '..'); {fix}"
        )
    return run_id


def check_user_name(user: str) -> str:
    """`user` itself, or a SpecError naming it and the allowed form."""
    if not isinstance(user, str) or not _USER_NAME.fullmatch(user):
        raise SpecError(
            f"user name {user!r} is not allowed: use 1-32 lowercase letters, digits, '_', '.' or '-', starting with a "
            "letter or '_' (a login name)"
        )
    return user


def contained(root: Path, *parts: str) -> Path:
    """`root/parts...`, resolved; a SpecError when links or `..` would take it outside `root`."""
    base = Path(root).resolve()
    path = base.joinpath(*parts).resolve()
    if not path.is_relative_to(base) or path == base:
        raise SpecError(f"{'/'.join(parts)!r} resolves to {path}, outside {base}; use a plain name under it")
    return path
