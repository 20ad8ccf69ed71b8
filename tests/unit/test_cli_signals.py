"""`tp` started as a script's background job (SIGINT ignored) keeps SIGTERM deliverable through Dagster."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a non-interactive shell starts a background job
from dagster._utils.interrupts import capture_interrupts
from training_platform.cli.main import keep_stop_signals_deliverable
if sys.argv[1] == "tp":
    keep_stop_signals_deliverable()
with capture_interrupts():  # what every in-process Dagster execution enters
    pass
print(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
"""


def _sigterm_ignored_after_dagster(mode: str) -> bool:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_dagster_turns_an_ignored_sigint_into_an_ignored_sigterm_and_tp_prevents_it():
    assert _sigterm_ignored_after_dagster("plain")  # the mechanism: children would inherit it
    assert not _sigterm_ignored_after_dagster("tp")
