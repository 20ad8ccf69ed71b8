"""`tp server start|stop|status`: the platform server of this platform home, in the background."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

from training_platform.cli.common import JsonFlag, console, fail, home, say
from training_platform.client import PlatformClient
from training_platform.client.connect import local_token
from training_platform.client.graphql import IN_PROGRESS
from training_platform.errors import PlatformError
from training_platform.server.local import COMPONENTS, LocalServer

server_app = typer.Typer(no_args_is_help=True, help="Run the platform server (Dagster webserver, daemon, code server).")
STOP_RUNS_WAIT_S = 60.0


@server_app.command()
def start(
    port: Annotated[
        int | None, typer.Option("--port", help="the UI and API port (default 3000, TP_SERVER_PORT)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start the platform server for this platform home (what is already running is kept)."""
    try:
        state = LocalServer(home()).start(port=port, say=say)
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps({"url": state.url, "running": state.alive()}))
    else:
        say(f"platform server running: UI and API on {state.url} (sign in with the token `tp token` prints)")


@server_app.command()
def stop(
    force: Annotated[
        bool, typer.Option("--force", help="cancel runs in progress first (their checkpoints stay)")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Stop the platform server of this platform home (refused while runs are in progress, unless --force)."""
    try:
        server = LocalServer(home())
        state = server.answering()
        if state is not None:  # the runs the server still runs are listed whatever else is down
            _stop_runs(PlatformClient(state.url, token=local_token(server, state.url)), force)
        stopped = server.stop()
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps({"stopped": stopped}))
    else:
        say(f"stopped: {', '.join(stopped)}" if stopped else "the platform server was not running")


def _stop_runs(client: PlatformClient, force: bool) -> None:
    active = client.runs(statuses=IN_PROGRESS)
    if not active:
        return
    if not force:
        names = ", ".join(sorted({r.partition or r.id for r in active})[:5])
        raise PlatformError(
            f"{len(active)} run(s) in progress ({names}); wait for them, cancel them (`tp cancel RUN`), "
            "or `tp server stop --force` to cancel them all"
        )
    for run in active:
        client.terminate(run.id)
    deadline = time.monotonic() + STOP_RUNS_WAIT_S
    while client.runs(statuses=IN_PROGRESS) and time.monotonic() < deadline:
        time.sleep(0.5)


@server_app.command()
def status(as_json: JsonFlag = False) -> None:
    """Which parts of the platform server run, and where its UI and logs are."""
    try:
        server = LocalServer(home())
    except PlatformError as exc:
        fail(exc, as_json)
    state = server.state()
    alive = state.alive() if state else dict.fromkeys(COMPONENTS, False)
    answering = server.running() is not None
    if as_json:
        print(json.dumps({"url": state and state.url, "answering": answering, "running": alive}))
    else:
        table = Table("part", "running", "log")
        for name in COMPONENTS:
            table.add_row(name, "[green]yes[/green]" if alive[name] else "[red]no[/red]", str(server.log_path(name)))
        console.print(table)
        say(f"UI and API: {state.url}" if answering and state else "not answering: start it with `tp server start`")
    if not answering:
        raise typer.Exit(1)
