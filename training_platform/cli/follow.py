"""How `tp` shows a run while it follows it: a progress bar on a terminal, a line per change elsewhere.

Ctrl-C detaches: the run goes on in the server, and the user is told how to follow or cancel it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from training_platform.client.runs import Progress as RunProgress

PLAIN_EVERY_S = 10.0  # a progress line at most this often when the output is not a terminal


class Detached(Exception):
    """The user pressed Ctrl-C: the run goes on without this client."""


def show(updates: Iterable[RunProgress], console: Console, run_id: str) -> RunProgress:
    """Render `updates` until the final one, which is returned; Ctrl-C raises Detached."""
    eta = Eta()
    last: RunProgress | None = None
    try:
        if console.is_terminal:
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
            ) as bar:
                task = bar.add_task(run_id, total=None, detail="")
                for last in updates:
                    bar.update(task, description=f"{run_id} {last.phase}", total=last.max_steps,
                               completed=last.step or 0, detail=_detail(last, eta))
        else:
            printed, printed_at = "", 0.0
            for last in updates:
                line = f"{run_id}: {last.phase}"
                detail = _detail(last, eta)
                changed = last.phase != printed
                if changed or (detail and time.monotonic() - printed_at >= PLAIN_EVERY_S):
                    console.print(line + (f"  {detail}" if detail else ""), highlight=False, soft_wrap=True)
                    printed, printed_at = last.phase, time.monotonic()
    except KeyboardInterrupt:
        raise Detached from None
    assert last is not None and last.final, "follow() ends with a final state"
    return last


def _detail(progress: RunProgress, eta: Eta) -> str:
    if progress.step is None or not progress.max_steps:
        return ""
    parts = [f"step {progress.step}/{progress.max_steps}"]
    if progress.metrics:
        parts.append(progress.metrics)
    remaining = eta.update(progress.step, progress.max_steps)
    if remaining is not None:
        parts.append(f"ETA {remaining:.0f} s")
    if progress.cost_usd:
        parts.append(f"${progress.cost_usd:.4f}")
    return "  ".join(parts)


class Eta:
    """Seconds left at the step rate seen since the first progress report."""

    def __init__(self):
        self._first: tuple[float, int] | None = None

    def update(self, step: int, max_steps: int) -> float | None:
        now = time.monotonic()
        if self._first is None or step < self._first[1]:
            self._first = (now, step)
            return None
        elapsed, done = now - self._first[0], step - self._first[1]
        return (max_steps - step) * elapsed / done if done > 0 and elapsed > 0 else None
