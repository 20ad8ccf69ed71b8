"""prctl(2) for the launch's processes: the signal a process gets when its parent dies, and the name ps shows."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def signal_on_parent_death(signum: signal.Signals) -> None:
    """Have the kernel send SIGNUM to this process when its parent dies (the caller checks that the parent did not
    die before this call: then no signal comes)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)


def set_process_name(name: str) -> None:
    """The name ps and psutil's name() show for this process (its main thread), at most 15 bytes."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode())
