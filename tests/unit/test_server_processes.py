"""`tp` knows the parts of its server by pid and start, whatever the system clock does meanwhile."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import psutil
import pytest

from training_platform.launch import process_start
from training_platform.server.local import ServerProcess


@pytest.fixture
def part():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield ServerProcess("daemon", proc.pid, psutil.Process(proc.pid).create_time(), process_start.start_mark(proc.pid))
    proc.kill()
    proc.wait()


def test_a_part_stays_alive_when_the_clock_is_set_ahead(part, monkeypatch):
    booted = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted() + 5.0)  # NTP, a virtual machine resumed
    assert psutil.Process(part.pid).create_time() - part.started == pytest.approx(5.0)
    assert part.alive()


def test_a_part_is_gone_once_it_ended_or_its_pid_is_another_process(part):
    assert part.alive()
    boot, ticks = part.start_mark.split(":")
    assert not replace(part, start_mark=f"{boot}:{int(ticks) - 100}").alive()  # its pid reused by a later process
    psutil.Process(part.pid).kill()
    psutil.Process(part.pid).wait(10)
    assert not part.alive()


def test_a_record_of_an_earlier_tp_is_matched_by_its_start_in_seconds(part):
    assert replace(part, start_mark=None).alive()
    assert not replace(part, start_mark=None, started=part.started - 60).alive()
