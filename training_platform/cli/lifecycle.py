"""`tp gc`: pins, tiering and GC of the home's checkpoint stores, run here against the stores.

Not through the server: it reads and writes the stores directly, as the `checkpoint_lifecycle`
schedule does (both are safe while runs save: see checkpoints/retention.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from training_platform.cli.common import JsonFlag, console, fail, home, say
from training_platform.errors import PlatformError
from training_platform.lifecycle.settings import load_settings, settings_path

if TYPE_CHECKING:
    from training_platform.lifecycle.collect import LifecycleReport


def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="change nothing; say what would go")] = False,
    grace_hours: Annotated[
        float | None,
        typer.Option("--grace-hours", min=0, help="keep unreferenced chunks younger than this; default: the settings'"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Free checkpoint chunks no kept checkpoint needs; move old checkpoints to the cold tier."""
    # Imported here: the stores' readers import torch (1.2 s), which every other `tp` command goes without.
    from training_platform.lifecycle.collect import run_lifecycle

    try:
        platform_home = home()
        settings = load_settings(platform_home.root)
        report = run_lifecycle(
            platform_home,
            settings,
            platform_home.mlflow_tracking_uri,
            dry_run=dry_run,
            grace_seconds=None if grace_hours is None else grace_hours * 3600,
        )
    except PlatformError as exc:
        fail(exc, as_json)
    show(report, str(settings_path(platform_home.root)))
    if as_json:
        print(json.dumps(report.as_dict()))
    if any(store.error for store in report.stores):
        raise typer.Exit(1)


def show(report: LifecycleReport, settings_file: str) -> None:
    verb = "would free" if report.dry_run else "freed"
    stores = Table("store", "cold tier", "stored", verb, "chunks", "waiting", title="checkpoint stores")
    runs = Table("store", "run", verb, "chunks", "moved to cold (steps)", title="per run")
    for store in report.stores:
        gc = store.gc
        if store.error:
            stores.add_row(store.uri, store.cold_uri or "-", "[red]error[/red]", "", "", "")
            say(f"[red]error:[/red] {store.uri}: {store.error}")
            continue
        waiting = gc.young_chunks + gc.postponed_chunks
        stores.add_row(
            store.uri,
            store.cold_uri or "-",
            size_text(gc.stored_bytes),
            size_text(gc.deleted_bytes),
            str(gc.deleted_chunks),
            str(waiting),
        )
        for run in sorted(set(gc.by_run) | set(store.tiered)):
            freed = gc.by_run.get(run)
            moved = store.tiered.get(run, [])
            runs.add_row(
                store.uri,
                run or "(no run: unfinished saves, older removals)",
                size_text(freed.bytes if freed else 0),
                str(freed.chunks if freed else 0),
                ", ".join(map(str, moved)) or "-",
            )
        if gc.put_back_chunks:
            say(
                f"{store.uri}: put {gc.put_back_chunks} chunks back from trash/ (a save named them while GC took "
                "them, or a GC that died had left them there)"
            )
        for uri, why in gc.skipped.items():
            say(f"[yellow]kept every chunk named by {uri}[/yellow]: {why}")
        for verb_, pins in (("pinned", store.pins.added), ("unpinned", store.pins.removed)) if store.pins else ():
            for run_id, step, reason in pins:
                say(f"{store.uri}: {verb_} {run_id} step {step} ({reason})")
    console.print(stores)
    if runs.row_count:
        console.print(runs)
    if report.registry_error:
        say(f"[yellow]model registry unreadable, pins left as they are:[/yellow] {report.registry_error}")
    say(
        f"{verb} {size_text(report.freed_bytes)} in {report.freed_chunks} chunks; chunks younger than "
        f"{report.grace_seconds / 3600:g} h wait (saves may be in flight). Settings: {settings_file}"
    )


def size_text(count: float) -> str:
    """COUNT bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
