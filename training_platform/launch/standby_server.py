"""The warm standby itself (standby.py has the requesters' side, and why): it imports what the agent and its workers
import, waits on its Unix socket, and forks each request as the requester's process.

`python -m training_platform.launch.standby_server JOB_PID` is a spot run's standby (the local launcher starts it
beside the attempt JOB_PID); `shared OWNER_PID` is the shared standby, which leaves with OWNER_PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

from training_platform.launch import frameworks
from training_platform.launch.prctl import set_process_name, signal_on_parent_death
from training_platform.launch.standby import (
    ADDRESS_ENV,
    FORWARDED_SIGNALS,
    HEAP_FREEZE,
    JOB_PID_FILE,
    MESSAGE_HEADER,
    STOP_FILE,
    address,
    peer_uid,
    shared_address,
)
from training_platform.runs.events import RunEvents
from training_platform.runs.layout import PREEMPTED_MARKER

# How long the shared standby stays with nothing to serve (its imports hold ~0.4 GB).
SHARED_IDLE_SECONDS = 1800.0
# How long a standby waits for the requeue after a preemption (a Dagster sensor tick is 10-30 s)...
IDLE_SECONDS = 300.0
# ...and after an attempt that was not preempted: a requeue may still be on its way (a cancel
# racing a preemption, a launcher that cleared the marker for its next submit already).
LINGER_SECONDS = 5.0
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
            if (uid := peer_uid(connection)) != os.getuid():
                raise PermissionError(f"refused a request from uid {uid}")
            header, fds, _, _ = socket.recv_fds(connection, MESSAGE_HEADER.size, 3)
            (length,) = MESSAGE_HEADER.unpack(header)
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
            signal_on_parent_death(signal.SIGTERM)  # a standby that dies stops its agents as a preemption
            # ps and the telemetry's rank lookup tell the agent from the ranks by name (same command line).
            set_process_name(f"tp-{request['role']}")
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, *FORWARDED_SIGNALS):
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
    """`python -m training_platform.launch.standby_server JOB_PID|shared OWNER_PID` (the launcher)."""
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
