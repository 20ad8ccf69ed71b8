"""A warm standby for a spot run on the local launcher: the attempt after a preemption starts warm.

A cold attempt spends ~2.5 s here importing torch (the agent and its fork server) before any rank
starts; a run preempted every 20 s loses a tenth of its time that way. For runs on spot capacity
the local launcher therefore starts one standby process per run directory. Once the run trains,
the standby imports what the agent and the workers import and waits, single-threaded, on a Unix
socket. A requeued attempt's agent finds it and, instead of starting cold, asks it to fork the
agent; that agent asks it in turn to fork each worker.

A forked process takes the requesting process's environment, working directory and
stdin/stdout/stderr, so it is the process the launcher (or torchrun) started in all but its pid.
The requester waits for it, forwards SIGTERM/SIGINT/SIGHUP to it, and ends as it ends; if the
requester dies, the standby kills what it forked (a SIGKILL of the job reaches everything).

The standby leaves when the run no longer needs it: when an attempt ends other than preempted, when
no attempt comes within IDLE_SECONDS of a preemption, or when the launcher cancels the run.

Every run's first attempt can start warm too, from the shared standby (SharedStandby): one per platform
home, code and import environment, started by the local launcher for the runs of a `tp server` and
leaving with that server. It loads at idle CPU priority, so the run that started it does not wait for
it, and from then on each run's agent and ranks are its forks: from a job's submission to its main
rank's start, 0.61 s instead of 4.67 s on two cores (benchmarks/warm_start.py).

This module is imported by the requesters, which start as bare interpreters: it imports nothing
heavy at module level.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from training_platform.launch import frameworks
from training_platform.launch.job_env import PREFIXES
from training_platform.runs.events import RunEvents

# Set (by LocalLauncher, for spot runs) in a job's environment: its agent looks for a standby.
STANDBY_ENV = "TP_WARM_STANDBY"
# Set (by LocalLauncher, where the launching process has SHARED_OWNER_ENV) in a job's environment: its agent
# looks for the shared standby.
SHARED_ENV = "TP_SHARED_STANDBY"
# Set by the platform's code server, to its own pid: the local launcher's runs use a shared standby, which leaves
# with that process.
SHARED_OWNER_ENV = "TP_SHARED_STANDBY_OWNER"
# Set in what a standby forks: the standby's address, where a forked agent's ranks ask for their own forks.
ADDRESS_ENV = "TP_STANDBY_ADDRESS"
# `python -m training_platform.launch.standby module MODULE ARGS`: a process that is no job's rank (a script's
# evaluation), forked by the shared standby of its environment (SHARED_ENV) where one is up, else run cold.
MODULE_ROLE = "module"
# How long the shared standby stays with nothing to serve (its imports hold ~0.4 GB).
SHARED_IDLE_SECONDS = 1800.0
# How long a standby waits for the requeue after a preemption (a Dagster sensor tick is 10-30 s)...
IDLE_SECONDS = 300.0
# ...and after an attempt that was not preempted: a requeue may still be on its way (a cancel
# racing a preemption, a launcher that cleared the marker for its next submit already).
LINGER_SECONDS = 5.0
# How long a requester waits for the standby to fork: a standby that does not answer is not used.
REPLY_SECONDS = 10.0
STOP_POLL_SECONDS = 2.0
# What the agent imports, besides what its workers import (agent.PRELOADED_MODULES).
AGENT_MODULES = ["torch.distributed.run", "torch.distributed.launcher.api", "training_platform.launch.agent"]
# What the main rank imports to report (train/reporting.py), once it knows it reports: 1.5 s of each start it
# serves otherwise, and 0.7 s more for the embedded default's SQLite tracking store (SQLAlchemy, Alembic). A cold
# start leaves them out of its fork server, which would import them for every rank. The run's plots (matplotlib,
# 0.4-0.6 s) are drawn by the main rank at its end.
REPORTING_MODULES = [
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "dagster_pipes",
    "training_platform.telemetry.plots",
]
# Imported after the preload: what it forks does not walk the preloaded heap in its garbage collections.
HEAP_FREEZE = "training_platform.launch.heap_freeze"
LOG_FILE = "standby.log"
SHARED_LOG_FILE = "shared-standby.log"  # in the platform home
# What a process imports torch with, besides the code: a job whose values differ here does not use a shared standby
# loaded with others. Its name prefixes are those of job_env.PREFIXES (torch, CUDA, OpenMP, the math libraries).
_IMPORT_NAMES = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV")
_IMPORT_NAMES += ("LD_LIBRARY_PATH", "TP_HOME")
# Matched by a prefix but read by torch only when called, not when imported: Lightning and DeepSpeed set it as they
# are imported (so in a Dagster run's process, not in the server that starts the shared standby for its runs).
_CALL_TIME_NAMES = frozenset({"PYTORCH_NVML_BASED_CUDA_CHECK"})
JOB_PID_FILE = "job.pid"  # written by the launcher at each submit: the attempt's process
STOP_FILE = "standby.stop"  # written by stop(): a standby still loading cannot be told over its socket
PR_SET_NAME = 15  # prctl(2): the process name (ps, psutil's name()) of the calling thread
_HEADER = struct.Struct("!I")
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def address(run_dir: Path, environ: Mapping[str, str] = os.environ) -> str:
    """The standby's socket, in the abstract namespace: no file to clean up, no path-length limit.

    It names the code too (interpreter, PYTHONPATH, the platform's newest source file): a standby
    loaded before the code changed is not used by an attempt of the new code.
    """
    return _address(os.path.realpath(run_dir), environ.get("PYTHONPATH", ""))


def shared_address(environ: Mapping[str, str] = os.environ) -> str:
    """The shared standby's socket for jobs with ENVIRON: it names the code and the whole import environment."""
    return _address("shared", json.dumps(sorted(import_environment(environ).items())))


def shared_addresses(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Where a job with ENVIRON looks for a shared standby, in order: one that loaded the frameworks its ranks use
    as well (frameworks.py), then one that loaded only what every run imports."""
    addresses = [shared_address(environ)]
    if frameworks.PRELOAD_ENV in environ:
        addresses.append(shared_address({k: v for k, v in environ.items() if k != frameworks.PRELOAD_ENV}))
    return addresses


def _address(*parts: str) -> str:
    package = Path(__file__).resolve().parents[1]
    newest = max(path.stat().st_mtime_ns for path in package.rglob("*.py"))
    key = "\0".join([*parts, sys.executable, str(newest)])
    return "\0training-platform-standby-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def import_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ENVIRON that the shared standby is started with: nothing of any one job's (no credentials). With
    the frameworks it is to load (frameworks.PRELOAD_ENV), the variables they read as they are imported."""
    preload = frameworks.named(environ.get(frameworks.PRELOAD_ENV, ""))
    prefixes = PREFIXES + tuple(prefix for name in preload for prefix in frameworks.FRAMEWORKS[name].env_prefixes)
    kept = {
        key: value
        for key, value in environ.items()
        if (key in _IMPORT_NAMES or key.startswith(prefixes)) and key not in _CALL_TIME_NAMES
    }
    if preload:
        kept[frameworks.PRELOAD_ENV] = ",".join(preload)
    return kept


def running(run_dir: Path, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the run has a standby (loading or ready) for jobs with ENVIRON: its socket is bound."""
    return bound(address(run_dir, environ))


def bound(name: str) -> bool:
    """Whether a standby (loading or ready) has the socket NAME."""
    with open("/proc/net/unix") as sockets:
        return any(line.rstrip("\n").endswith(" @" + name[1:]) for line in sockets)


# ----- requesters -------------------------------------------------------------------------------
def run_in_standby(name: str, role: str, argv: list[str]) -> int | None:
    """Have the standby at socket NAME fork ROLE with ARGV as this process; its exit status, or None if no standby
    is there.

    A negative status is the signal that ended it (as subprocess reports it).
    """
    connection = _connect(name)
    if connection is None:
        return None
    # Installed before the request: a signal that arrives before the pid does is forwarded once it does.
    forked: list[int] = []
    pending: list[int] = []
    for signum in _FORWARDED_SIGNALS:
        signal.signal(signum, lambda signum, _frame: _forward(forked, pending, signum))
    with connection:
        request = {"role": role, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        try:
            _send(connection, request, fds=[_open_or_devnull(fd) for fd in (0, 1, 2)])
            connection.settimeout(REPLY_SECONDS)
            replies = connection.makefile("r")
            started = replies.readline()
            connection.settimeout(None)
        except OSError:  # a timeout included
            started = ""
        if not started:  # the standby is leaving: start cold
            for signum in _FORWARDED_SIGNALS:
                signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
            for signum in pending:
                os.kill(os.getpid(), signum)
            return None
        forked.append(json.loads(started)["pid"])
        for signum in pending:
            _forward(forked, [], signum)
        ended = replies.readline()
    if not ended:
        print(f"training_platform.launch.standby: the standby died under {role}", file=sys.stderr)
        return 1
    return json.loads(ended)["exit"]


def stop(run_dir: Path, environ: Mapping[str, str] = os.environ) -> None:
    """Ask the run's standby, if any, to accept no more attempts and leave once its current ones end."""
    (run_dir / STOP_FILE).write_text("")  # read by a standby that the socket cannot reach; removed by the next submit
    connection = _connect(address(run_dir, environ))
    if connection is not None:
        with connection, contextlib.suppress(OSError):
            _send(connection, {"role": "stop"}, fds=[])


def exit_as(status: int) -> None:
    """End this process as a child that ended with STATUS did (exit code, or -signal)."""
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status if status >= 0 else 128 - status)  # as a shell reports a signal it could not re-raise


def _connect(name: str) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(name)
    except (ConnectionRefusedError, FileNotFoundError):  # none, or one still loading: start cold
        connection.close()
        return None
    if _peer_uid(connection) != os.getuid():  # another user bound the name first: never hand it our job
        connection.close()
        return None
    return connection


def _peer_uid(connection: socket.socket) -> int:
    _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid


def _send(connection: socket.socket, message: dict, fds: list[int]) -> None:
    body = json.dumps(message).encode()
    socket.send_fds(connection, [_HEADER.pack(len(body))], fds)
    connection.sendall(body)


def _open_or_devnull(fd: int) -> int:
    """FD, or /dev/null where this process was started without it (a closed stdin)."""
    try:
        os.fstat(fd)
    except OSError:
        return os.open(os.devnull, os.O_RDWR)
    return fd


def _forward(forked: list[int], pending: list[int], signum: int) -> None:
    if not forked:
        pending.append(signum)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(forked[0], signum)


# ----- the standby ------------------------------------------------------------------------------
def spawn(run_dir: Path, job_pid: int, env: dict[str, str]) -> None:
    """Start the run's standby beside job JOB_PID (it exits at once if the run has one already)."""
    with open(run_dir / LOG_FILE, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", __name__, str(job_pid)],
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a SIGTERM to the job's process group must not reach it
        )


def spawn_shared(home: Path, owner_pid: int, env: Mapping[str, str]) -> None:
    """Start the shared standby for jobs with ENV, to serve while OWNER_PID lives (it exits at once if one is
    there already)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / SHARED_LOG_FILE, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", __name__, "shared", str(owner_pid)],
            cwd=home,
            env=import_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Standby:
    """The server: forks requested processes and relays their exit; see the module docstring."""

    def __init__(self, run_dir: Path, listener: socket.socket):
        self.run_dir = run_dir
        self.listener = listener
        self.name = listener.getsockname()[1:].decode()  # bound already: its abstract name, without the leading NUL
        self.started_in = os.getcwd()
        # pid -> (the requester's connection, None once it is gone; "agent" or "worker")
        self.children: dict[int, tuple[socket.socket | None, str]] = {}
        self.watched: int | None = None  # pidfd of an attempt started cold (not by this standby)
        self.watched_pids: set[int] = set()
        self.stopping = False
        self.deadline: float | None = None  # when no attempt runs: leave at this time
        self.set_by_imports: dict[str, str] = {}  # what the preload's imports set in the environment
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake = wake_read
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that set_wakeup_fd sees it
        signal.set_wakeup_fd(wake_write)

    def watch(self, job_pid: int) -> None:
        """Follow attempt JOB_PID: this standby stays while it runs."""
        self.watched_pids.add(job_pid)
        try:
            self.watched = os.pidfd_open(job_pid)
        except ProcessLookupError:  # the attempt ended already
            self.watched = None

    def wait_for_training(self, since: float) -> bool:
        """Hold the imports until the run's first step after SINCE, so they do not slow its own start.

        False if the run needs no standby: its attempt ended before that step, not preempted.
        """
        from training_platform.launch.base import PREEMPTED_MARKER

        events, offset = RunEvents(self.run_dir), 0
        while True:
            if self.watched is None:
                self._attempt_changed()  # follows a new attempt, if one started cold meanwhile
                if self.watched is None:
                    return not self._stopped() and (self.run_dir / PREEMPTED_MARKER).is_file()
            new, offset = events.read_from(offset)
            if any(event["kind"] == "first_step" and event["at"] >= since for event in new):
                return not self._stopped()
            if select.select([self.watched], [], [], 0.5)[0]:
                os.close(self.watched)
                self.watched = None

    def preload(self) -> None:
        """Import what the agent and its workers import: no attempt it serves imports them again. That includes the
        frameworks its environment names (frameworks.PRELOAD_ENV), which only the runs that use them ask for."""
        import importlib

        from training_platform.launch.agent import PRELOADED_MODULES

        started, before = time.monotonic(), dict(os.environ)
        named = frameworks.named(os.environ.get(frameworks.PRELOAD_ENV, ""))
        extra = [module for name in named for module in frameworks.FRAMEWORKS[name].modules]
        for module in AGENT_MODULES + PRELOADED_MODULES + REPORTING_MODULES + extra + [HEAP_FREEZE]:
            importlib.import_module(module)
        # Lightning and DeepSpeed set variables as they are imported: a fork has them as a cold process would.
        self.set_by_imports = {key: value for key, value in os.environ.items() if before.get(key) != value}
        _log(f"ready in {time.monotonic() - started:.1f} s" + (f" (with {', '.join(named)})" if named else ""))

    def serve(self) -> None:
        self.listener.listen()
        self._attempt_changed()
        while True:
            if not self.children and self.deadline is not None and time.monotonic() >= self.deadline:
                if self._may_leave():
                    break
                self.deadline = None
            requesters = {c: pid for pid, (c, _) in self.children.items() if c is not None}
            waiting = [self.listener, self.wake, *requesters]
            if self.watched is not None:
                waiting.append(self.watched)
            timeout = None
            if not self.children and self.deadline is not None:
                # Waking now and then: a stop file (a cancel that could not reach the socket) ends the wait.
                timeout = max(0.0, min(self.deadline - time.monotonic(), STOP_POLL_SECONDS))
            readable, _, _ = select.select(waiting, [], [], timeout)
            if not readable and self._stopped():
                self._attempt_changed()
            if self.wake in readable:
                self._reap()
            if self.listener in readable:
                self._accept()
            if self.watched in readable:
                os.close(self.watched)
                self.watched = None
                self._attempt_changed()
            for connection, pid in requesters.items():
                # A requester sends nothing after its request: readable means it is gone.
                if connection in readable and pid in self.children:
                    self._requester_died(pid)
        _log("left")

    def _may_leave(self) -> bool:
        self._watch_cold_attempt()  # one last look: a requeue that started cold just now
        return self.watched is None

    def _attempt_changed(self) -> None:
        """With no attempt running: wait for a requeue (long after a preemption, briefly otherwise)."""
        from training_platform.launch.base import PREEMPTED_MARKER

        was_waiting = self.deadline is None
        if self.watched is None and not self._serving_an_attempt():
            self._watch_cold_attempt()
        if self.watched is not None or self._serving_an_attempt():
            self.deadline = None
        elif self._stopped():
            self.deadline = time.monotonic()
            if was_waiting:
                _log("stopped: leaving once its attempts end")
        elif (self.run_dir / PREEMPTED_MARKER).is_file():
            self.deadline = time.monotonic() + IDLE_SECONDS
            if was_waiting:
                _log(f"the attempt was preempted: waiting up to {IDLE_SECONDS:.0f} s for its requeue")
        elif was_waiting:
            self.deadline = time.monotonic() + LINGER_SECONDS
            _log(f"the attempt ended: leaving unless another starts within {LINGER_SECONDS:.0f} s")

    def _stopped(self) -> bool:
        self.stopping = self.stopping or (self.run_dir / STOP_FILE).is_file()
        return self.stopping

    def _serving_an_attempt(self) -> bool:
        return any(role == "agent" for _, role in self.children.values())

    def _watch_cold_attempt(self) -> None:
        """The run's current attempt, if one runs that this standby does not serve (one that started
        cold while it was loading; the job process of one whose agent just ended): follow it, not leave."""
        if self._stopped():
            return
        try:
            pid = int((self.run_dir / JOB_PID_FILE).read_text())
            started_here = os.readlink(f"/proc/{pid}/cwd") == os.path.realpath(self.run_dir)
        except (OSError, ValueError):  # no attempt, or it has ended
            return
        if started_here and pid not in self.watched_pids:
            _log(f"following attempt {pid}")
            self.watch(pid)

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        fds: list[int] = []
        try:
            # Any local user can reach an abstract socket: fork only for this standby's own user.
            if (uid := _peer_uid(connection)) != os.getuid():
                raise PermissionError(f"refused a request from uid {uid}")
            header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
            (length,) = _HEADER.unpack(header)
            body = b""
            while len(body) < length:
                chunk = connection.recv(length - len(body))
                if not chunk:
                    raise ConnectionError("requester left mid-request")
                body += chunk
            request = json.loads(body)
            if request["role"] == "stop":
                self.stopping = True
                self._attempt_changed()
            elif not self._stopped():  # a stopped standby answers nothing: the requester starts cold
                self._fork(request, fds, connection)
                return
        except (OSError, ValueError, KeyError, struct.error) as exc:
            _log(f"request not served: {exc}")
        finally:
            for fd in fds:
                os.close(fd)
        connection.close()

    def _fork(self, request: dict, fds: list[int], connection: socket.socket) -> None:
        pid = os.fork()
        if pid == 0:
            self._become(request, fds, connection)
        # Also here, not only in the child: killpg must find the group even if the child has not run yet.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        self.children[pid] = (connection, request["role"])
        _log(f"forked {request['role']} {pid} in {request['cwd']}")
        try:
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            self._requester_died(pid)  # gone before it heard of the fork
        self._attempt_changed()

    def _become(self, request: dict, fds: list[int], connection: socket.socket) -> None:
        """In the forked child: become the requester's process, run its role, never return."""
        status = 1
        try:
            os.setpgid(0, 0)  # its own group: the standby can stop it with everything it starts
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # a standby that dies stops its agents as a preemption
            # ps and the telemetry's rank lookup tell the agent from the ranks by name (same command line).
            libc.prctl(PR_SET_NAME, f"tp-{request['role']}".encode())
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, *_FORWARDED_SIGNALS):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            # Only the requester and the standby hold the connection: a standby that dies is seen at once.
            for closing in (self.listener, connection, *(c for c, _ in self.children.values() if c is not None)):
                closing.close()
            os.close(self.wake)
            if self.watched is not None:
                os.close(self.watched)
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            for key, value in self.set_by_imports.items():
                os.environ.setdefault(key, value)
            os.environ[ADDRESS_ENV] = self.name
            if sys.path and sys.path[0] == self.started_in:  # `python -m`'s entry, as the requester's has it
                sys.path[0] = request["cwd"]
            sys.argv = [request["role"], *request["argv"]]
            status = _run_role(request["role"], request["argv"])
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def _reap(self) -> None:
        while True:
            try:
                os.read(self.wake, 512)
            except BlockingIOError:
                break
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            if pid not in self.children:
                continue
            connection, role = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            _log(f"{role} {pid} ended: {code}")
            # Decided before the requester hears of the end: once the job ends, the launcher may
            # clear the preemption marker for the requeue.
            self._attempt_changed()
            if connection is not None:
                with contextlib.suppress(OSError):  # its requester may be gone
                    connection.sendall(json.dumps({"exit": code}).encode() + b"\n")
                connection.close()

    def _requester_died(self, pid: int) -> None:
        """A requester killed outright (SIGKILL of the job): what it asked for dies with it."""
        connection, role = self.children[pid]
        connection.close()
        self.children[pid] = (None, role)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


class SharedStandby(Standby):
    """Forks the agents and ranks of every run whose jobs have its import environment, while its owner lives."""

    def preload_at_idle_priority(self) -> bool:
        """Import at idle CPU priority, so the runs that start cold meanwhile do not wait for it; False if the
        normal priority could not be taken back (then what it forks would run at idle priority: it serves none)."""
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        self.preload()
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            _log(f"not serving: could not leave idle priority ({exc})")
            return False
        return True

    def _may_leave(self) -> bool:
        return True

    def _watch_cold_attempt(self) -> None:
        """Runs are not followed: each requester holds its connection while what it asked for runs."""

    def _stopped(self) -> bool:
        return self.stopping

    def _attempt_changed(self) -> None:
        if self.watched is None and not self.stopping:  # the owner ended
            self.stopping = True
            _log("its owner ended: leaving once what it forked ends")
        if self.children:
            self.deadline = None
        elif self.deadline is None or self.stopping:
            self.deadline = time.monotonic() + (0.0 if self.stopping else SHARED_IDLE_SECONDS)


def _run_role(role: str, argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from training_platform.launch.agent import launch, run_module

    # record(): the error file torchrun reads, as its own agent and workers write it.
    if role == "agent":
        record(launch)(argv, workers_from_standby=True)
        return 0
    if role == "worker":
        record(run_module)(*argv)
        return 0
    raise ValueError(f"unknown role {role!r}")


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} standby {os.getpid()}: {message}", flush=True)


def main(argv: list[str]) -> None:
    """`python -m training_platform.launch.standby JOB_PID|shared OWNER_PID` (the launcher), `worker MODULE ARGS`
    (a forked agent) or `module MODULE ARGS` (MODULE_ROLE)."""
    if argv[0] == "shared":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(shared_address())  # bound, not yet listening: requesters start cold meanwhile
        except OSError:
            return  # there is one already
        shared = SharedStandby(Path.cwd(), listener)
        shared.watch(int(argv[1]))
        if shared.watched is not None and shared.preload_at_idle_priority():
            shared.serve()
        return
    if argv[0] == MODULE_ROLE:
        for name in shared_addresses() if os.environ.get(SHARED_ENV) else []:
            status = run_in_standby(name, "worker", argv[1:])
            if status is not None:
                exit_as(status)
        sys.argv = argv[1:]  # as `python -m MODULE ARGS` has them
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if argv[0] == "worker":
        # An agent killed outright takes its workers along, as the job's process group would.
        agent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != agent:  # it died before the line above
            sys.exit(1)
        status = run_in_standby("\0" + os.environ[ADDRESS_ENV], "worker", argv[1:])
        if status is None:
            sys.exit("training_platform.launch.standby: the standby that forked this agent is gone; no worker started")
        exit_as(status)
    since, run_dir = time.time(), Path.cwd()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(run_dir))  # bound, not yet listening: requesters start cold meanwhile
    except OSError:
        return  # this run has a standby already
    standby = Standby(run_dir, listener)
    standby.watch(int(argv[0]))
    if standby.wait_for_training(since):
        standby.preload()
        standby.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
