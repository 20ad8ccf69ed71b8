"""When a process started, as a mark that tells it from a later process given the same pid.

A pid is reused once its process ends, so with each pid the platform follows (a server's parts, a run's follower)
it records when that process started, and a process with that pid is the one recorded only if it started then.
The mark is read from /proc/PID/stat: the start in clock ticks since boot, with the boot's id. psutil's
create_time() is no such mark: it adds to that count the boot time that the system clock implies now, so it moves
whenever the clock is set or slewed (NTP, a virtual machine resumed). A move of a second makes every part of a
running server look gone to a `tp` that compares those (a red suite showed just that: `tp` refused to start "on a
taken port", and `tp server stop` left the server running), and a follower recorded with a hundredth of a second's
tolerance look gone after a slew.
"""

from __future__ import annotations

import functools
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_STARTTIME_FIELD = 22  # of /proc/PID/stat, counted from 1 (proc(5)); the third is the first after the command


def start_mark(pid: int) -> str | None:
    """`BOOT_ID:TICKS` for the process PID, or None when there is none (or it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = _boot_id()
    except OSError:
        return None
    # The command (in parentheses) may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return f"{boot}:{fields[_STARTTIME_FIELD - 3]}"


def is_same_process(pid: int, mark: str) -> bool:
    """Whether PID is still the process whose start_mark was MARK."""
    return start_mark(pid) == mark


@functools.cache
def _boot_id() -> str:
    """This boot's id: read once, a process does not outlive its boot (`tp` asks at every poll of its server)."""
    return _BOOT_ID.read_text().strip()
