"""Bodies of `tp status`, `tp metrics` and `tp doctor --bench`; main.py injects what lists runs.

Kept out of main.py so the command line stays a thin composition root: `list_records` is the
caller's function that lists run records (the platform server's runs merged with run telemetry).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from training_platform.cli.terminal import readable_duration
from training_platform.spec import TrainSpec
from training_platform.telemetry.records import RunRecord
from training_platform.telemetry.status import status_rows

if TYPE_CHECKING:
    from training_platform.telemetry.bench import BenchResult


def human_seconds(seconds: float | None) -> str:
    return "-" if seconds is None else readable_duration(seconds)


def show_status(list_records: Callable[[], list[RunRecord]], team: str | None, as_json: bool, console: Console):
    rows = status_rows(list_records(), time.time(), team)
    if as_json:
        print(json.dumps({"team": team, "runs": [r.to_dict() for r in rows]}))
        return
    if not rows:
        console.print(f"no queued or running runs{f' for team {team}' if team else ''}", highlight=False)
        return
    table = Table("run", "team", "status", "waited", "est. wait", "progress", "util %", "cost so far")
    for row in rows:
        table.add_row(
            row.run_id,
            row.team,
            row.status,
            human_seconds(row.waited_s),
            human_seconds(row.estimated_wait_s) if row.status == "QUEUED" else "-",
            f"{row.progress:.0%}" if row.progress is not None else "-",
            f"{row.utilization_pct:.0f}" if row.utilization_pct is not None else "-",
            f"${row.cost_usd:.4f}" if row.cost_usd is not None else "-",
        )
    console.print(table)


def serve_metrics(
    list_records: Callable[[], list[RunRecord]],
    port: int,
    addr: str,
    console: Console,
    stop: threading.Event | None = None,
) -> None:
    """Serve /metrics until interrupted (or `stop` is set)."""
    from training_platform.telemetry.prometheus import serve

    server, _ = serve(list_records, port=port, addr=addr)
    console.print(f"Prometheus metrics on http://{addr}:{server.server_port}/metrics (Ctrl-C to stop)", highlight=False)
    stop = stop or threading.Event()
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


def bench(spec: TrainSpec, store_uri: str, snapshot_root: Path | str, console: Console) -> list[BenchResult]:
    from training_platform.telemetry.bench import run_bench  # torch: only `tp doctor --bench` needs it

    console.print("benchmarking: checkpoint write, all-reduce, data read, GPU topology ...", highlight=False)
    results = run_bench(spec, store_uri, snapshot_root)
    table = Table("bench", "value", "ok", "verdict")
    for result in results:
        value = f"{result.value:g} {result.unit}" if result.value is not None else "-"
        table.add_row(result.name, value, "[green]yes[/green]" if result.ok else "[red]no[/red]", result.verdict)
    console.print(table)
    return results
