"""The first admin of a platform home: the account that starts its server.

On one machine security costs no step: when the home's teams file names no admin yet, the first `tp server start`
(or any `tp` command that starts the server) writes the login name of the account running it into `admins`,
creates a token for it (tokens.py) and saves the token where that account's `tp` finds it
(client/credentials.py). A teams file named by TP_TEAMS is the operator's own and is left as it is.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from pathlib import Path

from training_platform.client.credentials import home_key, save_token
from training_platform.errors import SpecError
from training_platform.identifiers import check_user_name
from training_platform.paths import PlatformHome
from training_platform.policy.teams import TEAMS_ENV, TEAMS_FILE, add_first_admin, load_teams
from training_platform.server.tokens import TokenStore


def ensure_first_admin(home: PlatformHome, say: Callable[[str], None] = print) -> str | None:
    """Make this account the home's first admin, with a saved token, if the home has none; the user, or None."""
    if os.environ.get(TEAMS_ENV):
        return None
    user = getpass.getuser()
    try:
        check_user_name(user)
    except SpecError:
        say(
            f"this account's name {user!r} cannot be a platform user; name an admin in "
            f"{Path(home.root) / TEAMS_FILE} (admins: [NAME]) and create a token with `tp admin token create NAME`"
        )
        return None
    _, path = load_teams(home.root)  # written first for a new home
    if not add_first_admin(path, user):
        return None
    token = TokenStore(home.root).create(user, label="first admin")
    path = save_token(token, home_key(home.root))
    say(f"{user} is this platform home's first admin (teams.yaml: admins); its token is saved in {path}")
    return user
