"""Who you are to the platform (issue 63, first slice): the admins of teams.yaml, tokens kept only as hashes, the
account that starts a home's server as its first admin, `tp login`, and the token `tp` sends with each request."""

from __future__ import annotations

import getpass
import http.server
import json
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from tests.fixtures.platform import TP, platform_env
from training_platform.client.credentials import home_key, save_token, saved_token, server_key
from training_platform.client.graphql import ClientError, PlatformClient
from training_platform.errors import PlatformError, SpecError
from training_platform.identifiers import PLATFORM_USER
from training_platform.paths import PlatformHome
from training_platform.policy.teams import add_first_admin, load_teams, read_teams_file, seed_teams_file
from training_platform.server.first_admin import ensure_first_admin
from training_platform.server.local import LocalServer
from training_platform.server.tokens import TokenStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_is_shown_once_kept_as_a_hash_and_names_its_user(tmp_path):
    store = TokenStore(tmp_path)
    token = store.create("alice", label="laptop")
    other = store.create("bob")
    assert token.startswith("tp_") and len(token) > 40 and token != other
    assert store.user_of(token) == "alice" and store.user_of(other) == "bob"
    assert store.user_of(token + "x") is None and store.user_of("tp_guessed") is None and store.user_of("") is None
    kept = store.path.read_text()
    assert token not in kept and other not in kept  # only hashes
    assert _mode(store.path) == 0o600 and _mode(store.directory) == 0o700
    assert [(r.user, r.label) for r in store.tokens()] == [("alice", "laptop"), ("bob", "")]
    assert store.revoke("alice") == 1 and store.user_of(token) is None and store.user_of(other) == "bob"


def test_the_servers_own_token_is_renewed_and_its_user_is_no_persons(tmp_path):
    store = TokenStore(tmp_path)
    alice = store.create("alice")
    first = store.renew_server_token()
    second = store.renew_server_token()
    assert store.user_of(first) is None and store.user_of(second) == PLATFORM_USER  # one at a time
    assert store.user_of(alice) == "alice"
    with pytest.raises(PlatformError, match="the platform server's own user"):
        store.create(PLATFORM_USER)


def test_a_revocation_counts_at_once_for_a_server_that_read_the_tokens_before(tmp_path):
    serving = TokenStore(tmp_path)  # the webserver's, which keeps what it read while the file is unchanged
    token = TokenStore(tmp_path).create("alice")
    assert serving.user_of(token) == "alice"
    TokenStore(tmp_path).revoke("alice")  # `tp admin token revoke`, another process
    assert serving.user_of(token) is None
    again = TokenStore(tmp_path).create("alice")
    assert serving.user_of(again) == "alice"


@pytest.mark.parametrize("user", ["", "Alice", "../bob", "a b", "x" * 40, "alice\nbob"])
def test_a_user_name_that_is_not_a_login_name_gets_no_token(tmp_path, user):
    with pytest.raises(SpecError, match="is not allowed: use 1-32 lowercase letters"):
        TokenStore(tmp_path).create(user)


def test_tp_token_wins_and_a_saved_token_is_for_its_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("TP_TOKEN", raising=False)
    assert saved_token(server_key("http://127.0.0.1:3000")) is None
    path = save_token("tp_saved", server_key("http://127.0.0.1:3000/"), home_key(tmp_path / "home"))
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert saved_token(server_key("HTTP://127.0.0.1:3000")) == "tp_saved"
    assert saved_token(home_key(tmp_path / "home")) == "tp_saved"
    assert saved_token(server_key("http://127.0.0.1:3001")) is None
    monkeypatch.setenv("TP_TOKEN", "tp_from_ci")
    assert saved_token(server_key("http://127.0.0.1:3000")) == "tp_from_ci"
    with pytest.raises(PlatformError, match="is not a server URL"):
        server_key("127.0.0.1:3000")


def test_the_first_admin_is_written_into_the_teams_file_with_its_comments_kept(tmp_path):
    path = seed_teams_file(tmp_path)
    assert read_teams_file(path).admins == ()
    assert add_first_admin(path, "alice") is True
    text = path.read_text()
    assert "admins: [alice]  # the platform's operators" in text and "# The teams of this platform home" in text
    assert read_teams_file(path).admins == ("alice",)
    assert add_first_admin(path, "bob") is False  # there is an admin already
    assert read_teams_file(path).admins == ("alice",)


def test_a_teams_file_without_admins_gets_the_line_before_its_teams(tmp_path):
    (tmp_path / "teams.yaml").write_text("# ours\nteams:\n  team-a:\n    members: [alice]\n")
    assert add_first_admin(tmp_path / "teams.yaml", "carol") is True
    assert (tmp_path / "teams.yaml").read_text() == "# ours\nadmins: [carol]\nteams:\n  team-a:\n    members: [alice]\n"


def test_an_admin_that_is_no_login_name_is_refused_naming_the_file(tmp_path):
    (tmp_path / "teams.yaml").write_text("admins: [Not Valid]\nteams: {}\n")
    with pytest.raises(SpecError, match="teams.yaml"):
        read_teams_file(tmp_path / "teams.yaml")


def test_the_account_that_starts_a_homes_server_is_its_first_admin_and_its_tp_finds_the_token(tmp_path, monkeypatch):
    monkeypatch.delenv("TP_TEAMS", raising=False)
    monkeypatch.delenv("TP_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = PlatformHome(tmp_path / "home")
    said = []
    user = getpass.getuser()
    assert ensure_first_admin(home, said.append) == user
    assert load_teams(home.root)[0].admins == (user,)
    token = saved_token(home_key(home.root))
    assert TokenStore(home.root).user_of(token) == user
    assert len(said) == 1 and "first admin" in said[0]
    assert ensure_first_admin(home, said.append) is None  # once
    assert len(TokenStore(home.root).tokens()) == 1


def test_a_teams_file_the_operator_names_is_left_as_it_is(tmp_path, monkeypatch):
    teams = tmp_path / "ours.yaml"
    teams.write_text("teams:\n  team-a: {}\n")
    monkeypatch.setenv("TP_TEAMS", str(teams))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert ensure_first_admin(PlatformHome(tmp_path / "home")) is None
    assert teams.read_text() == "teams:\n  team-a: {}\n"
    assert not (tmp_path / "config").exists()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        _Recorder.seen.append(self.headers.get("Authorization"))
        known = self.headers.get("Authorization") == "Bearer tp_abc"
        body = json.dumps({"data": {"ok": True}} if known else {"error": "sign in"}).encode()
        self.send_response(200 if known else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_tp_sends_its_token_with_each_request_and_nothing_without_one():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert PlatformClient(url, token="tp_abc").query("{ ok }") == {"ok": True}
        # A refusal names what was sent and the fix, not "did not answer".
        refused = r"does not know you \(no token: you sent none; it said: sign in\).*tp login"
        with pytest.raises(ClientError, match=refused):
            PlatformClient(url).query("{ ok }")
        with pytest.raises(ClientError, match="does not know you \\(the token you sent"):
            PlatformClient(url, token="tp_revoked").query("{ ok }")
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.seen == ["Bearer tp_abc", None, "Bearer tp_revoked"]


def _tp(home: Path, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TP, *args], env=platform_env(home, **env), input=stdin, capture_output=True, text=True, timeout=120
    )


def test_an_admin_creates_a_members_token_which_they_keep_with_tp_login(tmp_path):
    home, config = tmp_path / "home", tmp_path / "config"
    (tmp_path / "teams.yaml").write_text("admins: [root]\nteams:\n  team-a:\n    members: [alice]\n")
    settings = {"TP_TEAMS": str(tmp_path / "teams.yaml"), "XDG_CONFIG_HOME": str(config)}
    refused = _tp(home, "admin", "token", "create", "mallory", **settings)
    assert refused.returncode == 2 and "'mallory' is neither an admin nor a member" in refused.stderr
    assert refused.stdout == ""
    created = _tp(home, "admin", "token", "create", "alice", "--label", "ci", **settings)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()  # the result on stdout, the message on stderr
    assert token.startswith("tp_") and "shown only now" in created.stderr
    assert TokenStore(home).user_of(token) == "alice"
    listed = _tp(home, "admin", "token", "list", "--json", **settings)
    assert [(t["user"], t["label"]) for t in json.loads(listed.stdout)] == [("alice", "ci")]
    assert token not in listed.stdout

    wrong = _tp(home, "login", "--token-stdin", stdin="not-a-token\n", **settings)
    assert wrong.returncode == 2 and "not a platform token" in wrong.stderr
    logged_in = _tp(home, "login", "--token-stdin", stdin=token + "\n", **settings)
    assert logged_in.returncode == 0, logged_in.stderr
    saved = json.loads((config / "tp" / "credentials.json").read_text())["tokens"]
    assert saved == {home_key(home): token}
    shown = _tp(home, "token", **settings)  # what to paste into the UI's sign-in page
    assert shown.returncode == 0 and shown.stdout.strip() == token, shown.stderr
    revoked = _tp(home, "admin", "token", "revoke", "alice", **settings)
    assert revoked.returncode == 0 and TokenStore(home).user_of(token) is None


def test_tp_token_is_the_servers_own_for_its_account_and_says_so_when_there_is_none(tmp_path):
    home, config = tmp_path / "home", tmp_path / "config"
    settings = {"XDG_CONFIG_HOME": str(config)}
    none = _tp(home, "token", **settings)
    assert none.returncode != 0 and none.stdout == "" and "you have no token" in none.stderr
    server = LocalServer(PlatformHome(home))
    server.token_file.parent.mkdir(parents=True)
    server.token_file.write_text(TokenStore(home).renew_server_token())  # as `tp server start` writes it
    shown = _tp(home, "token", **settings)
    assert shown.returncode == 0 and TokenStore(home).user_of(shown.stdout.strip()) == PLATFORM_USER
