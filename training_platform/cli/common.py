"""What every `tp` command shares: the console, errors as one line, JSON output, the platform home.

Every command that takes `--json` ends its output with one JSON object on the last line.
Errors a user can act on print one line and exit non-zero (2 for bad input), without a traceback.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.table import Table

from training_platform.cli.follow import Detached, show
from training_platform.cli.terminal import console, readable
from training_platform.client import PlatformClient, connect
from training_platform.client.runs import Progress, follow
from training_platform.errors import PlatformError
from training_platform.paths import PlatformHome
from training_platform.redaction import redact

JsonFlag = Annotated[bool, typer.Option("--json", help="end with one JSON object on the last line")]


def emit(summary: dict[str, Any], as_json: bool, hidden: tuple[str, ...] = ("checkpoints",)) -> None:
    if as_json:
        print(redact(json.dumps(summary, default=str)))  # e.g. a tracking URI with user:password@
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in summary.items():
        if key not in hidden and value is not None:
            table.add_row(key, redact(readable(value)))
    console.print(table)


def fail(exc: PlatformError, as_json: bool) -> None:
    message = redact(str(exc).strip())
    if as_json:
        print(json.dumps({"status": "REFUSED" if exc.exit_code == 2 else "FAILED", "error": message}))
    for line in message.splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True)  # one line each, any width
    raise typer.Exit(exc.exit_code)


def say(message: str) -> None:
    console.print(message, highlight=False, soft_wrap=True)


def home() -> PlatformHome:
    platform_home = PlatformHome.from_env()
    try:
        platform_home.ensure()
    except OSError as exc:
        raise PlatformError(
            f"the platform home {platform_home.root} cannot be written ({exc.strerror}); "
            "set TP_HOME to a directory you can write"
        ) from None
    os.environ.setdefault("TP_HOME", str(platform_home.root))
    os.environ.setdefault("DAGSTER_HOME", str(platform_home.dagster_home))
    return platform_home


def client(platform_home: PlatformHome) -> PlatformClient:
    """The platform server's client; the home's own server is started in the background when needed."""
    return connect(platform_home, say=say)


def follow_run(
    platform: PlatformClient, run_id: str, dagster_run_id: str, as_json: bool, retries_allowed: int = 0
) -> Progress:
    """Show the run until it ends; Ctrl-C detaches (exit 0: the run goes on) and says how to find it again."""
    try:
        return show(follow(platform, run_id, dagster_run_id, retries_allowed), console, run_id)
    except Detached:
        say(f"detached: run {run_id} goes on in the platform server ({platform.url})")
        say(f"  follow it: tp logs {run_id} -f   list runs: tp runs   cancel it: tp cancel {run_id}")
        if as_json:
            print(json.dumps({"run_id": run_id, "status": "DETACHED", "dagster_run_id": dagster_run_id}))
        raise typer.Exit(0) from None
