"""`tp checkpoints RUN`: a run's checkpoints as its store holds them, and the step `tp resume` would continue from.

Read from the store directly, as `tp gc` is, not through the server: the store the run's last attempt recorded
(else its spec's, else the home's own), or `--store`.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Column, Table

from training_platform.cli.common import JsonFlag, console, fail, home, say
from training_platform.cli.lifecycle import size_text
from training_platform.errors import CheckpointError, PlatformError
from training_platform.identifiers import check_run_id
from training_platform.redaction import redact

if TYPE_CHECKING:
    from training_platform.checkpoints.store import CheckpointStore


def checkpoints(
    run: Annotated[str, typer.Argument(help="run id (as `tp train` and `tp runs` print it)")],
    store: Annotated[
        str | None, typer.Option("--store", help="the store to read (a directory or s3://...); default: the run's")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """A run's checkpoints: what each save wrote and cost the loop, its tier and pins, whether it restores."""
    # Imported here: the store's readers import torch (1.2 s), which most `tp` commands go without.
    from training_platform.checkpoints.store import open_store
    from training_platform.lifecycle.stores import run_store_uri

    # The listing says why a manifest does not parse; the store's own warning would say it twice.
    logging.getLogger("training_platform.checkpoints.store").setLevel(logging.ERROR)
    uri = store
    try:
        check_run_id(run, fix="list runs with `tp runs`")
        uri = uri or run_store_uri(home(), run)
        opened = open_store(uri)
        listing = listing_of(opened, run)
    except PlatformError as exc:
        fail(exc, as_json)
    except OSError as exc:
        fail(CheckpointError(f"the checkpoint store {uri} cannot be read ({exc}); check --store and access"), as_json)
    if as_json:
        print(redact(json.dumps(listing)))
        return
    show(listing)


def listing_of(store: CheckpointStore, run_id: str) -> dict[str, Any]:
    """The run's checkpoints (oldest step first) with their pins and whether each restores, the manifests that do
    not parse, and the step a resume would continue from."""
    found = store.scan(run_id)
    pins: dict[int, list[str]] = {}
    for pin in store.pins(run_id):
        pins.setdefault(pin.step, []).append(pin.reason)
    rows = [
        manifest.summary()
        | {
            "metrics": manifest.metrics,
            "format": str(manifest.attributes.get("format", "tensors")),
            "pins": sorted(pins.get(manifest.step, [])),
            "restores": store.restorable(manifest),
        }
        for manifest in found.manifests
    ]
    restoring = [row["step"] for row in rows if row["restores"]]
    return {
        "run_id": run_id,
        "store": store.uri,
        "checkpoints": rows,
        "unreadable": {str(step): why for step, why in sorted(found.unreadable.items())},
        "resumes_from": max(restoring) if restoring else None,
    }


def show(listing: dict[str, Any]) -> None:
    run_id, rows = listing["run_id"], listing["checkpoints"]
    if not rows and not listing["unreadable"]:
        say(f"run {run_id} has no checkpoints in {listing['store']} (--store reads another store)")
        return
    table = Table(
        Column("step", justify="right"),
        "saved (UTC)",
        "tier",
        Column("size", justify="right"),
        Column("written", justify="right"),
        Column("stall s", justify="right"),
        Column("background s", justify="right"),
        "metrics",
        "pinned",
        "restores",
        title=f"checkpoints of {run_id} in {listing['store']}",
    )
    for row in rows:
        table.add_row(
            str(row["step"]),
            _when(row["created_at"]),
            row["tier"],
            size_text(row["bytes"]),
            size_text(row["bytes_written"]),
            f"{row['stall_seconds']:.3f}",
            f"{row['background_seconds']:.3f}",
            " ".join(f"{name}={value:.4g}" for name, value in sorted(row["metrics"].items())) or "-",
            ", ".join(row["pins"]) or "-",
            "yes" if row["restores"] else "[red]no[/red]",
        )
    if rows:
        console.print(table)
    for step, why in listing["unreadable"].items():
        say(f"[yellow]step {step} does not restore:[/yellow] {why}")
    if listing["resumes_from"] is not None:
        say(f"`tp resume {run_id}` continues from step {listing['resumes_from']}")
    else:
        say(
            f"[red]none of run {run_id}'s checkpoints restores[/red] (a damaged chunk, an unsigned or edited "
            "manifest): its next attempt fails at start rather than start over; see README 'When no checkpoint "
            "restores'"
        )


def _when(created_at: str) -> str:
    try:
        return datetime.fromisoformat(created_at).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return created_at
