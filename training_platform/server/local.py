"""The platform as a service on one machine: a Dagster code server, webserver and daemon for a platform home.

`tp server start|stop|status` runs them in the background; every `tp` command that submits or reads
runs starts them when they are not running. Each process has its own process group, its pid and
start time in `$TP_HOME/server/server.json` and its log beside it, so `stop` ends exactly what
`start` started (a pid reused by another program since is left alone).

The three processes, as a team deployment runs them (Dagster's `dagster dev` does the same, but
stops everything when one part dies):
- the code server loads `definitions` once and starts each run in a process of its own, forked from a
  warm interpreter (training_platform_dagster/code_server.py), so runs start in a fraction of a second and
  outlive a webserver or daemon restart. It listens on a Unix socket in a directory only the server's
  account can enter (no TCP port: any local process could ask it to run code);
- the webserver serves the UI and the GraphQL API that `tp` is a client of;
- the daemon dequeues runs (the queued run coordinator of deploy/dagster/dagster.yaml: per-team
  limits and priorities), and runs sensors, schedules and backfills.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import yaml

from training_platform.errors import PlatformError
from training_platform.launch import process_start
from training_platform.paths import SOURCE_CHECKOUT, PlatformHome
from training_platform.server.first_admin import ensure_first_admin
from training_platform.server.tokens import AUTH_DIR, TokenStore
from training_platform.shipped import INSTANCE_CONFIG
from training_platform.spec.submission import LOCATION
from training_platform.state.private_files import write_private

DEFAULT_PORT = 3000
PORT_ENV = "TP_SERVER_PORT"
SHIPPED_INSTANCE = INSTANCE_CONFIG
COMPONENTS = ("code-server", "webserver", "daemon")
START_TIMEOUT_S = 180.0
LOAD_ERROR_GRACE_S = 15.0
STOP_TIMEOUT_S = 30.0
DATABASE_ENV = "TP_DAGSTER_DATABASE_URL"
_STORAGES = (
    ("run_storage", "RunStorage"),
    ("event_log_storage", "EventLogStorage"),
    ("schedule_storage", "ScheduleStorage"),
)


def _storage_config(comment: str, module: str, config: dict[str, object]) -> str:
    """The instance config's run, event-log and schedule storage: MODULE's classes, each with CONFIG."""
    # A copy for each: one shared dict would be written once and referred to by YAML anchors, hard to read.
    blocks = {key: {"module": module, "class": cls, "config": copy.deepcopy(config)} for key, cls in _STORAGES}
    return f"\n# {comment}\n" + yaml.safe_dump(blocks, sort_keys=False)


def _postgres_storage() -> str:
    """PostgreSQL storage; the URL, and the password in it, stay in the server's environment (the file names it)."""
    return _storage_config(
        f"PostgreSQL storage, {DATABASE_ENV} from the environment (training_platform_dagster/postgres_storage.py)",
        "training_platform_dagster.postgres_storage",
        {"postgres_url": {"env": DATABASE_ENV}},
    )


def _sqlite_storage(dagster_home: Path) -> str:
    """SQLite storage in DAGSTER_HOME, in the files Dagster's default uses, with connections kept open between uses
    (training_platform_dagster/sqlite_storage.py). The home is written out: a storage class is given its config only,
    and an instance opened from this file elsewhere must find these files."""
    return _storage_config(
        "SQLite storage in this Dagster home, kept connections (training_platform_dagster/sqlite_storage.py)",
        "training_platform_dagster.sqlite_storage",
        {"base_dir": str(dagster_home.resolve())},
    )


class ServerError(PlatformError):
    """The platform server cannot start or be reached; the message says why and the fix."""


def instance_config(dagster_home: Path) -> str:
    """The shipped instance config, on SQLite in DAGSTER_HOME; with TP_DAGSTER_DATABASE_URL set, on PostgreSQL
    (run, event-log and schedule storage). The URL, and the password in it, stay in the server's environment: the
    file names the variable."""
    shipped = SHIPPED_INSTANCE.read_text()
    url = os.environ.get(DATABASE_ENV, "")
    if not url:
        return shipped + _sqlite_storage(dagster_home)
    scheme = url.split("://", 1)[0]
    if scheme != "postgresql+psycopg2":
        # SQLAlchemy 2 reads postgresql:// as psycopg 3, on which Dagster's event log fails at its first event.
        raise ServerError(
            f"{DATABASE_ENV} must be a postgresql+psycopg2://user:password@host:port/database URL (it starts "
            f"with {scheme}://); write it with that scheme"
        )
    return shipped + _postgres_storage()


@dataclass(frozen=True)
class ServerProcess:
    name: str
    pid: int
    started: float  # when it started, in seconds since the epoch (for people reading server.json)
    # When it started, as process_start.py marks it: a pid reused by another program is not ours. None in a record
    # written by an earlier `tp`, which matched `started` instead (to a second: a step of the clock lost the server).
    start_mark: str | None = None

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            if self.start_mark is not None:
                ours = process_start.is_same_process(self.pid, self.start_mark)
            else:
                ours = abs(process.create_time() - self.started) < 1.0
            return ours and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


@dataclass
class ServerState:
    port: int
    code_socket: str | None  # None: recorded by a version whose code server listened on a TCP port
    processes: dict[str, ServerProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> dict[str, bool]:
        return {name: name in self.processes and self.processes[name].alive() for name in COMPONENTS}


class LocalServer:
    """The platform server of one platform home."""

    def __init__(self, home: PlatformHome):
        self.home = home
        self.dir = home.root / "server"
        self.state_file = self.dir / "server.json"
        self.workspace = self.dir / "workspace.yaml"
        # The server's own token, readable by the server's account only: its `tp` (stop, status, the tests) is let in
        # without a login. Renewed at each fresh start.
        self.token_file = home.root / AUTH_DIR / "server-token"

    # ----- reading ----------------------------------------------------------------------------
    def state(self) -> ServerState | None:
        """What `start` recorded (None when nothing was, or the record cannot be read: nothing of it is trusted)."""
        try:
            raw = json.loads(self.state_file.read_text())
            processes = {name: ServerProcess(**p) for name, p in raw.get("processes", {}).items()}
            return ServerState(int(raw["port"]), raw.get("code_socket"), processes)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def running(self) -> ServerState | None:
        """The state when every part is alive and the webserver answers; else None."""
        state = self.state()
        if state is None or not all(state.alive().values()):
            return None
        return state if _answers(state.url) else None

    def answering(self) -> ServerState | None:
        """The state when the webserver answers, whatever else runs (its runs can be listed and cancelled)."""
        state = self.state()
        return state if state is not None and state.alive()["webserver"] and _answers(state.url) else None

    def log_path(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def server_token(self) -> str | None:
        """The server's own token; None where this account cannot read it (or no server started here)."""
        try:
            return self.token_file.read_text().strip() or None
        except OSError:
            return None

    # ----- starting ---------------------------------------------------------------------------
    def start(self, port: int | None = None, say=print) -> ServerState:
        """Start whatever part is not running (all of them on a fresh home); wait until runs can be submitted."""
        self._check_writable()
        ensure_first_admin(self.home, say)
        with self._start_lock():
            state = self.state()
            if state is not None and state.code_socket is None:  # an older version's server: started anew
                self._stop_processes(state, STOP_TIMEOUT_S)
                state = None
            alive = state.alive() if state else dict.fromkeys(COMPONENTS, False)
            if state is None or not any(alive.values()):
                if state is not None:
                    _remove_socket_dir(state.code_socket)
                state = ServerState(port or _default_port(), _new_code_socket())
                _check_port_free(state.port)
                write_private(self.token_file, TokenStore(self.home.root).renew_server_token())
                self._write_instance_config(say)
                self._write_workspace(state.code_socket)
            elif port is not None and port != state.port:
                raise ServerError(
                    f"the platform server of {self.home.root} already runs on port {state.port}; "
                    f"stop it first (`tp server stop`) to move it to port {port}"
                )
            missing = [name for name in COMPONENTS if not alive[name]]
            if not missing:
                return self._wait_ready(state)
            for name in missing:
                state.processes.pop(name, None)  # what died is started again, not waited for
            say(f"starting the platform server ({', '.join(missing)}) for {self.home.root}; logs in {self.dir}")
            for name in missing:
                if name == "webserver" and not alive["code-server"]:
                    self._wait_for_grpc(state)
                state.processes[name] = self._spawn(name, state)
                self._save(state)
                if name == "webserver":
                    # The webserver creates the instance's storage: the daemon starts after it, not beside it.
                    self._wait_ready(state)
            return self._wait_ready(state)

    def _spawn(self, name: str, state: ServerState) -> ServerProcess:
        # Where a relative path in a spec resolves: the source tree when running from one (examples/...),
        # else the home. An installed wheel imports `definitions` from site-packages either way.
        workdir = SOURCE_CHECKOUT or self.dir
        commands = {
            # Dagster's gRPC server, starting runs from a warm fork server (training_platform_dagster/code_server.py).
            "code-server": [
                sys.executable, "-m", "training_platform_dagster.code_server", "-m", LOCATION, "--location-name",
                LOCATION, "--socket", str(state.code_socket), "--working-directory", str(workdir),
            ],
            # dagster-webserver, every request authenticated (training_platform_dagster/webserver.py).
            "webserver": [
                sys.executable, "-m", "training_platform_dagster.webserver", "-h", "127.0.0.1", "-p", str(state.port),
                "-w", str(self.workspace),
            ],
            # dagster-daemon, its queue looking for freed slots at its interval (training_platform_dagster/daemon.py).
            "daemon": [sys.executable, "-m", "training_platform_dagster.daemon", "run", "-w", str(self.workspace)],
        }
        env = {
            **os.environ,
            "TP_HOME": str(self.home.root),
            "DAGSTER_HOME": str(self.home.dagster_home),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.log_path(name), "ab") as log:
            process = subprocess.Popen(
                commands[name],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: `stop` ends it with every process it started
                preexec_fn=_default_interrupts,
            )
        started = psutil.Process(process.pid).create_time()
        return ServerProcess(name, process.pid, started, process_start.start_mark(process.pid))

    def _wait_for_grpc(self, state: ServerState) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _socket_open(state.code_socket):
            self._fail_if_dead(state, "code-server")
            if time.monotonic() > deadline:
                log = self.log_path("code-server")
                raise ServerError(f"the code server did not listen within {START_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(0.2)

    def _wait_ready(self, state: ServerState) -> ServerState:
        """Until the webserver answers and has loaded the code location.

        A load error is reported once it persists for LOAD_ERROR_GRACE_S: a webserver whose code server
        was just started again shows the location as failed until it reconnects.
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        failing_since: float | None = None
        while True:
            for name in state.processes:
                self._fail_if_dead(state, name)
            problem = location_problem(state.url, self.server_token())
            if problem is None:
                return state
            loading = problem.startswith("loading") or problem == "unreachable"
            failing_since = None if loading else failing_since or time.monotonic()
            if failing_since is not None and time.monotonic() - failing_since > LOAD_ERROR_GRACE_S:
                raise ServerError(f"the platform's code does not load: {problem}; see {self.log_path('code-server')}")
            if time.monotonic() > deadline:
                raise ServerError(
                    f"the platform server did not become ready within {START_TIMEOUT_S:.0f} s ({problem}); "
                    f"see the logs in {self.dir}"
                )
            time.sleep(0.25)

    def _fail_if_dead(self, state: ServerState, name: str) -> None:
        if not state.processes[name].alive():
            tail = _tail(self.log_path(name))
            raise ServerError(f"the platform's {name} exited at start: {tail}; see {self.log_path(name)}")

    def _write_instance_config(self, say) -> None:
        """The shipped instance config (the queue), when the home has none or an older copy of it; an instance
        config of the operator's own is kept, with a word when it does not use the platform's queue."""
        target = self.home.dagster_home / "dagster.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        ours = instance_config(self.home.dagster_home)
        current = target.read_text() if target.exists() else None
        if current is None or current == _LEGACY_INSTANCE_CONFIG or (
            current != ours and current.startswith(ours.splitlines()[0])
        ):
            target.write_text(ours)
        elif "TeamQueuedRunCoordinator" not in current:
            say(f"note: {target} does not use the platform's queue (TeamQueuedRunCoordinator): per-team limits "
                f"and priorities do not apply; see {SHIPPED_INSTANCE}")

    def _write_workspace(self, code_socket: str) -> None:
        workspace = {"load_from": [{"grpc_server": {"socket": code_socket, "location_name": LOCATION}}]}
        self.workspace.write_text(yaml.safe_dump(workspace, sort_keys=False))

    def _save(self, state: ServerState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        payload = {"port": state.port, "code_socket": state.code_socket}
        payload["processes"] = {name: asdict(p) for name, p in state.processes.items()}
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(self.state_file)

    def _check_writable(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ServerError(
                f"the platform home {self.home.root} is not writable ({exc.strerror}); "
                "set TP_HOME to a directory you can write"
            ) from None

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        """One starter at a time: three `tp train` at once on a fresh home start one server."""
        with open(self.dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # ----- stopping ---------------------------------------------------------------------------
    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop the processes `start` started (daemon first, code server last); the names stopped."""
        with self._start_lock():
            state = self.state()
            if state is None:
                return []
            stopped = self._stop_processes(state, timeout_s)
            _remove_socket_dir(state.code_socket)
            self.state_file.unlink(missing_ok=True)
            return stopped

    def _stop_processes(self, state: ServerState, timeout_s: float) -> list[str]:
        stopped = []
        for name in reversed(COMPONENTS):
            process = state.processes.get(name)
            if process is not None and process.alive():
                _stop_group(process, timeout_s)
                stopped.append(name)
        return stopped


# Written by earlier versions of `tp` into a new home: no queue, so it is replaced by the shipped config.
_LEGACY_INSTANCE_CONFIG = "telemetry:\n  enabled: false\n"


def _stop_group(process: ServerProcess, timeout_s: float) -> None:
    """SIGTERM to the process's group (Dagster shuts its children down on it), SIGKILL after the timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if process.alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _default_interrupts() -> None:
    """In a server process, before it execs: SIGINT and SIGTERM do what they do by default. A background job of a
    shell starts with SIGINT ignored, and Dagster handles SIGTERM as SIGINT: `stop` would wait for its timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _default_port() -> int:
    raw = os.environ.get(PORT_ENV, str(DEFAULT_PORT))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ServerError(f"{PORT_ENV}={raw!r} is not a port number; set it to a free port such as 3000")
    return int(raw)


def _check_port_free(port: int) -> None:
    with socket.socket() as probe:
        # As the webserver binds: connections of a server stopped a moment ago (TIME_WAIT) do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise ServerError(
                f"port {port} is taken (another program, or the server of another platform home); "
                f"start on another one: `tp server start --port N` or {PORT_ENV}=N"
            ) from None


# The code server's socket: in a directory of its own, made by mkdtemp (0700, a name no one can take first), under
# the temporary directory because a socket's path may not exceed 107 bytes and a home's path may be long.
SOCKET_DIR_PREFIX = "tp-server-"
CODE_SOCKET = "code-server.sock"


def _new_code_socket() -> str:
    return str(Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)) / CODE_SOCKET)


def _remove_socket_dir(code_socket: str | None) -> None:
    """The socket's directory, if it is one `_new_code_socket` made (a record is not trusted to name another)."""
    if code_socket is None:
        return
    directory = Path(code_socket).parent
    if directory.parent == Path(tempfile.gettempdir()) and directory.name.startswith(SOCKET_DIR_PREFIX):
        shutil.rmtree(directory, ignore_errors=True)


def _socket_open(path: str | None) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        return path is not None and probe.connect_ex(path) == 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


_LOCATION_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def location_problem(url: str, token: str | None) -> str | None:
    """None when the webserver at `url` has loaded the platform's code location; else what is wrong. TOKEN: sent as
    the bearer token (the webserver answers nothing else without one)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": _LOCATION_QUERY}).encode(),
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return "the server does not know the token sent (sign in: `tp login`, or set TP_TOKEN)"
        return "unreachable"
    except (urllib.error.URLError, OSError, json.JSONDecodeError):
        return "unreachable"
    workspace = (body.get("data") or {}).get("workspaceOrError") or {}
    for entry in workspace.get("locationEntries", []):
        if entry["name"] != LOCATION:
            continue
        if entry["loadStatus"] == "LOADING":
            return "loading the code location"
        loaded = entry.get("locationOrLoadError") or {}
        if loaded.get("__typename") == "PythonError":
            return loaded["message"].strip().splitlines()[-1]
        return None if loaded else "loading the code location"
    return "loading the code location"


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "no output"
