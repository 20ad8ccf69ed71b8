"""`tp snapshots` and `tp snapshots show ID`: the dataset snapshots in the platform server, and their verdicts."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Column, Table

from training_platform.cli.common import JsonFlag, client, console, emit, fail, home, say
from training_platform.client.snapshots import list_snapshots, show_snapshot
from training_platform.errors import PlatformError

snapshots_app = typer.Typer(
    help="Dataset snapshots: id, source, rows per split, whether they passed their expectations.",
    invoke_without_command=True,
)


@snapshots_app.callback()
def snapshots(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Option("--source", help="only snapshots of this source")] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many snapshots")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List the snapshots the platform server built, the most recent first."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        found = list_snapshots(client(home()), source)[:limit]
    except PlatformError as exc:
        fail(exc, as_json)
    if as_json:
        print(json.dumps({"snapshots": [s.row() for s in found]}))
        return
    if not found:
        say("no snapshots" + (f" of {source}" if source else "") + "; `tp train` builds the day's snapshot first")
        return
    table = Table(Column("snapshot", no_wrap=True), "source", "rows", "splits", "expectations", "built", "days")
    for snapshot in found:
        splits = " / ".join(f"{name} {rows}" for name, rows in snapshot.rows.items())
        built = time.strftime("%Y-%m-%d %H:%M", time.localtime(snapshot.built))
        days = ", ".join(snapshot.days[:3]) + (f" (+{len(snapshot.days) - 3})" if len(snapshot.days) > 3 else "")
        table.add_row(
            snapshot.snapshot_id,
            snapshot.source,
            str(sum(snapshot.rows.values())),
            splits,
            snapshot.verdict,
            built,
            days or "-",
        )
    console.print(table)


@snapshots_app.command()
def show(
    snapshot: Annotated[str, typer.Argument(help="snapshot id, or a unique prefix of it")],
    as_json: JsonFlag = False,
) -> None:
    """One snapshot: its splits, schema, and each expectation that failed, with counts and examples."""
    try:
        found = show_snapshot(client(home()), snapshot)
    except PlatformError as exc:
        fail(exc, as_json)
    details = found.details()
    if as_json:
        print(json.dumps(details))
        return
    check = details.pop("check")
    schema = details.pop("schema")
    details["built"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found.built))
    details["schema"] = ", ".join(f"{name}: {kind}" for name, kind in schema.items()) or None
    details["check"] = check["summary"] if check else "no check evaluated this snapshot"
    emit(details, as_json=False)
    for failure in (check or {}).get("failed", []):
        what = f"{failure['expectation']}({failure.get('column') or ''})"
        line = f"[red]failed[/red] {failure.get('check') or what}: {what} {json.dumps(failure.get('details'))}"
        console.print(line, highlight=False, soft_wrap=True)  # one line each, whatever the width
