"""A run id given to `tp logs|cancel|resume|reproduce` is checked where it enters: a mistyped one is told at
once, in one line naming it and how to list runs, before any platform server is started to look it up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.platform import TP, platform_env


@pytest.mark.parametrize("command", ["logs", "cancel", "resume", "reproduce"])
def test_a_run_id_that_cannot_name_a_run_is_refused_without_a_server(tmp_path: Path, command: str) -> None:
    home = tmp_path / "home"
    args = [TP, command, "../other-team"] + (["--json"] if command != "logs" else [])
    proc = subprocess.run(args, env=platform_env(home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "run '../other-team' is not allowed" in lines[0] and "tp runs" in lines[0], lines
    if command != "logs":
        assert json.loads(proc.stdout.splitlines()[-1])["status"] == "REFUSED"
    assert not (home / "server").exists()  # nothing was started to look it up
