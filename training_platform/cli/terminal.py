"""The console every `tp` command prints to, and how a number reads there (JSON keeps the value as it is)."""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console

# Wide when not a terminal (a pipe, a CI log, a file): tables keep run ids and figures whole rather than
# eliding them to fit 80 columns.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def readable(value: Any) -> str:
    """VALUE as a person reads it: floats to four significant digits without an exponent (0.5168 not
    0.5168033730877046, 0.00003626 not 3.626e-05), large ones whole with separators; anything else as str()."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    if value == 0 or not math.isfinite(value) or abs(value) < 1e-9:
        return f"{value:.4g}"
    shown = f"{value:.{max(0, 3 - math.floor(math.log10(abs(value))))}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def readable_usd(usd: float) -> str:
    """Dollars to the hundredth of a cent, and what rounds below that said so (not 1.845e-09)."""
    return "<0.0001" if 0 < usd < 0.0001 else f"{usd:,.4f}"


def readable_duration(seconds: float) -> str:
    """A duration in the unit a person reads it in: '<1 s', '42 s', '12 min', '3.5 h'."""
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"
