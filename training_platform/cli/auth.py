"""`tp login` and `tp admin token create|list|revoke`: who `tp` is to the platform server.

`tp admin token` works on this platform home's token store (server/tokens.py), so it runs on the server's account;
`tp login` keeps a token for this account (client/credentials.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from training_platform.cli.common import JsonFlag, fail, home, say
from training_platform.client import SERVER_URL_ENV
from training_platform.client.connect import local_token
from training_platform.client.credentials import TOKEN_ENV, home_key, save_token, saved_token, server_key
from training_platform.errors import PlatformError, SpecError
from training_platform.identifiers import check_user_name
from training_platform.policy.teams import load_teams
from training_platform.server.local import LocalServer
from training_platform.server.tokens import PREFIX, TokenStore

admin_app = typer.Typer(no_args_is_help=True, help="Operate the platform: users' tokens.")
token_app = typer.Typer(no_args_is_help=True, help="API tokens of this platform home's users.")
admin_app.add_typer(token_app, name="token")


@token_app.command("create")
def create_token(
    user: Annotated[str, typer.Argument(help="an admin or a team member of teams.yaml")],
    label: Annotated[str, typer.Option("--label", help="what the token is for (shown by `tp admin token list`)")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Create a token for USER and print it once (only its hash is kept): hand it to them for `tp login`."""
    platform_home = home()
    try:
        check_user_name(user)
        teams, path = load_teams(platform_home.root)
        known = set(teams.admins) | {member for team in teams.teams.values() for member in team.members}
        if user not in known:
            raise SpecError(
                f"{user!r} is neither an admin nor a member of a team in {path}; add them to a team's `members` "
                "(or to `admins`) first"
            )
        token = TokenStore(platform_home.root).create(user, label=label)
    except PlatformError as exc:
        fail(exc, as_json)
    print(json.dumps({"user": user, "token": token}) if as_json else token)
    say(f"a token for {user}: shown only now; they keep it with `tp login` (or in {TOKEN_ENV})")


@token_app.command("list")
def list_tokens(
    user: Annotated[str | None, typer.Argument(help="only this user's")] = None,
    as_json: JsonFlag = False,
) -> None:
    """The tokens of this home: user, label and creation time (never the token)."""
    try:
        records = TokenStore(home().root).tokens(user)
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps([{"user": r.user, "label": r.label, "created_at": r.created_at} for r in records]))
        return
    table = Table("USER", "LABEL", "CREATED")
    for record in records:
        table.add_row(record.user, record.label, time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created_at)))
    Console(width=None if sys.stdout.isatty() else 160).print(table)  # a result: on stdout


@token_app.command("revoke")
def revoke_tokens(
    user: Annotated[str, typer.Argument(help="whose tokens to revoke")],
    as_json: JsonFlag = False,
) -> None:
    """Revoke every token of USER."""
    try:
        revoked = TokenStore(home().root).revoke(check_user_name(user))
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps({"user": user, "revoked": revoked}))
    say(f"revoked {revoked} token(s) of {user}")


def login(
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the token from standard input (scripts), not a prompt")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Keep your token for the platform server (TP_SERVER_URL, else this home's own server)."""
    token = sys.stdin.readline().strip() if token_stdin else typer.prompt("token", hide_input=True, err=True).strip()
    try:
        if not token.startswith(PREFIX):
            raise SpecError(f"that is not a platform token (they start with {PREFIX!r}); ask an admin for one")
        url = os.environ.get(SERVER_URL_ENV)
        key = server_key(url) if url else home_key(home().root)
        path = save_token(token, key)
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps({"server": key, "saved_in": str(path)}))
    say(f"token saved for {url or 'this platform home'} in {path}")


def token(as_json: JsonFlag = False) -> None:
    """Print the token `tp` signs in with (TP_SERVER_URL's server, else this home's own): paste it into the UI's
    sign-in page."""
    url = os.environ.get(SERVER_URL_ENV)
    try:
        if url:
            value = saved_token(server_key(url))
        else:
            server = LocalServer(home())
            state = server.state()
            value = local_token(server, state.url if state else None)
    except PlatformError as exc:
        fail(exc, as_json)
    if value is None:
        fail(PlatformError("you have no token for this server: ask an admin for one (`tp admin token create USER`) "
                           "and keep it with `tp login`"), as_json)
    print(json.dumps({"token": value}) if as_json else value)
