"""`tp server start|status|stop`: what runs, what refuses to start (and why, in one line), what stop leaves behind."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import psutil
import pytest

from tests.fixtures.platform import Platform, free_port, last_json, platform_env, server_logs
from training_platform.client.graphql import ClientError, PlatformClient
from training_platform.spec.submission import LOCATION, REPOSITORY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_start_status_and_stop_end_exactly_what_started(tmp_path):
    home = tmp_path / "home"
    platform = Platform(home, platform_env(home, TP_SERVER_PORT=str(free_port())))
    started = platform.tp("server", "start", "--json")
    assert started.returncode == 0, started.stderr + server_logs(home)
    assert last_json(started)["running"] == {"code-server": True, "webserver": True, "daemon": True}
    status = platform.tp("server", "status", "--json")
    assert status.returncode == 0 and last_json(status)["url"] == platform.url
    # Every request needs a token: none is refused, the server's own (its account's `tp`) is let in.
    with pytest.raises(ClientError, match="does not know you"):
        PlatformClient(platform.url).query("{ version }")
    token_file = home / "auth" / "server-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert platform.token not in (home / "auth" / "tokens.json").read_text()  # only its hash is kept
    schedules = _schedule_states(platform)  # the fixture's TP_SCHEDULES=off: nothing here runs by the hour
    assert set(schedules) >= {"nightly_retraining", "checkpoint_lifecycle_schedule"}, schedules
    assert set(schedules.values()) == {"STOPPED"}, schedules
    processes = json.loads((home / "server" / "server.json").read_text())["processes"]
    groups = {name: _group(p["pid"]) for name, p in processes.items()}
    assert all(groups.values()), groups  # each part with the processes it started (the code server's gRPC child)
    # The code server answers on a Unix socket only its account can reach, and on no TCP port.
    code_socket = Path(json.loads((home / "server" / "server.json").read_text())["code_socket"])
    assert code_socket.is_socket() and stat.S_IMODE(code_socket.parent.stat().st_mode) == 0o700
    listening = [
        c.laddr for p in groups["code-server"] if _alive(p) for c in p.net_connections("inet") if c.status == "LISTEN"
    ]
    assert listening == [], listening

    again = platform.tp("server", "start")  # a running server is kept, not doubled
    assert again.returncode == 0 and "starting" not in again.stderr
    assert json.loads((home / "server" / "server.json").read_text())["processes"] == processes

    stopped = platform.tp("server", "stop", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(last_json(stopped)["stopped"]) == ["code-server", "daemon", "webserver"]
    left = [p for group in groups.values() for p in group if _alive(p)]
    assert not left, left
    assert not code_socket.parent.exists()
    assert platform.tp("server", "status").returncode == 1


def test_a_taken_port_is_refused_in_one_line_with_the_fix(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        platform = Platform(tmp_path / "home", platform_env(tmp_path / "home", TP_SERVER_PORT=str(port)))
        proc = platform.tp("train", "examples/digits.yaml")  # a command that starts the server
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"port {port} is taken" in lines[0] and "--port" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "server" / "server.json").exists()


def test_a_home_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    platform = Platform(blocked / "home", platform_env(blocked / "home", TP_SERVER_PORT=str(free_port())))
    proc = platform.tp("server", "start")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "TP_HOME" in lines[0] and str(blocked / "home") in lines[0], proc.stderr


_SCHEDULES = """
query ($repo: RepositorySelector!) {
  schedulesOrError(repositorySelector: $repo) {
    __typename
    ... on Schedules { results { name scheduleState { status } } }
  }
}"""


def _schedule_states(platform: Platform) -> dict[str, str]:
    repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
    found = platform.client().query(_SCHEDULES, repo=repo)["schedulesOrError"]
    assert found["__typename"] == "Schedules", found
    return {s["name"]: s["scheduleState"]["status"] for s in found["results"]}


def _group(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if _pgid(p) == pid]


def _pgid(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, psutil.Error):
        return None


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
