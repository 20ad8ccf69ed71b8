"""The code server's socket (server/local.py): a private directory of its own, removed with the server, and a record
of an older version (a TCP port) read as a server to start anew."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from training_platform.paths import PlatformHome
from training_platform.server import local


def test_each_start_gets_a_private_socket_directory_that_stop_removes():
    code_socket = Path(local._new_code_socket())
    directory = code_socket.parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and len(str(code_socket)) < 100
    assert Path(local._new_code_socket()).parent != directory  # no name anyone could take first
    local._remove_socket_dir(str(code_socket))
    assert not directory.exists()


def test_a_recorded_path_outside_the_servers_own_directories_is_never_removed(tmp_path):
    kept = tmp_path / "tp-server-mine"
    kept.mkdir()
    local._remove_socket_dir(str(kept / local.CODE_SOCKET))
    assert kept.exists()


def test_an_older_versions_record_is_read_as_having_no_socket(tmp_path):
    server = local.LocalServer(PlatformHome(tmp_path))
    server.dir.mkdir(parents=True)
    server.state_file.write_text(json.dumps({"port": 3000, "grpc_port": 4266, "processes": {}}))
    state = server.state()
    assert state is not None and state.port == 3000 and state.code_socket is None


def test_the_workspace_names_the_socket_not_a_port(tmp_path):
    server = local.LocalServer(PlatformHome(tmp_path))
    server.dir.mkdir(parents=True)
    server._write_workspace("/tmp/tp-server-x/code-server.sock")
    assert server.workspace.read_text() == (
        "load_from:\n- grpc_server:\n    socket: /tmp/tp-server-x/code-server.sock\n    location_name: definitions\n"
    )
