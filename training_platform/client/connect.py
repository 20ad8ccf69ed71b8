"""Where `tp` finds the platform server: `TP_SERVER_URL` (a team's server), else the home's own server,
started in the background when it is not running (so `make demo` stays one command); and the token it sends there
(credentials.py; for the home's own server, the server's own token when the user has none)."""

from __future__ import annotations

import os
from collections.abc import Callable

from training_platform.client.credentials import home_key, saved_token, server_key
from training_platform.client.graphql import PlatformClient
from training_platform.paths import PlatformHome
from training_platform.server.local import LocalServer, ServerError, location_problem

SERVER_URL_ENV = "TP_SERVER_URL"


def connect(home: PlatformHome, start: bool = True, say: Callable[[str], None] = print) -> PlatformClient:
    """A client of the server that runs this home's runs; the home's own server is started when `start`."""
    url = os.environ.get(SERVER_URL_ENV)
    if url:
        token = saved_token(server_key(url))
        problem = location_problem(url.rstrip("/"), token)
        if problem is not None:
            raise ServerError(
                f"the platform server at {url} ({SERVER_URL_ENV}) is not ready: {problem}; "
                f"check that it runs, or unset {SERVER_URL_ENV} to use this machine's own server"
            )
        return PlatformClient(url, token=token)
    server = LocalServer(home)
    state = server.running()
    if state is None:
        if not start:
            raise ServerError(f"the platform server of {home.root} is not running; start it with `tp server start`")
        state = server.start(say=say)
    return PlatformClient(state.url, token=local_token(server, state.url))


def local_token(server: LocalServer, url: str | None) -> str | None:
    """The token for this home's own server (at URL, when known): the user's own (TP_TOKEN, `tp login`, the first
    admin's), else the server's own where this account can read it (the account that runs the server)."""
    keys = [home_key(server.home.root)] + ([server_key(url)] if url else [])
    return saved_token(*keys) or server.server_token()
