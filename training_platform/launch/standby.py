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

This module is the requesters' side (and the roles `worker` and `module`, run as `python -m`): it is imported
by bare interpreters, so it imports nothing heavy at module level. The standby itself is standby_server.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import runpy
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from training_platform.launch import frameworks
from training_platform.launch.job_env import PREFIXES
from training_platform.launch.prctl import signal_on_parent_death

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
# How long a requester waits for the standby to fork: a standby that does not answer is not used.
REPLY_SECONDS = 10.0
# Imported after the preload: what it forks does not walk the preloaded heap in its garbage collections.
HEAP_FREEZE = "training_platform.launch.heap_freeze"
SERVER_MODULE = "training_platform.launch.standby_server"  # the standby: `python -m` it
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
MESSAGE_HEADER = struct.Struct("!I")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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
    for signum in FORWARDED_SIGNALS:
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
            for signum in FORWARDED_SIGNALS:
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
    if peer_uid(connection) != os.getuid():  # another user bound the name first: never hand it our job
        connection.close()
        return None
    return connection


def peer_uid(connection: socket.socket) -> int:
    _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid


def _send(connection: socket.socket, message: dict, fds: list[int]) -> None:
    body = json.dumps(message).encode()
    socket.send_fds(connection, [MESSAGE_HEADER.pack(len(body))], fds)
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


# ----- starting a standby -----------------------------------------------------------------------
def spawn(run_dir: Path, job_pid: int, env: dict[str, str]) -> None:
    """Start the run's standby beside job JOB_PID (it exits at once if the run has one already)."""
    with open(run_dir / LOG_FILE, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, str(job_pid)],
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
            [sys.executable, "-m", SERVER_MODULE, "shared", str(owner_pid)],
            cwd=home,
            env=import_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def main(argv: list[str]) -> None:
    """`python -m training_platform.launch.standby worker MODULE ARGS` (a forked agent's worker) or
    `module MODULE ARGS` (MODULE_ROLE)."""
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
        signal_on_parent_death(signal.SIGKILL)
        if os.getppid() != agent:  # it died before the line above
            sys.exit(1)
        status = run_in_standby("\0" + os.environ[ADDRESS_ENV], "worker", argv[1:])
        if status is None:
            sys.exit("training_platform.launch.standby: the standby that forked this agent is gone; no worker started")
        exit_as(status)
    raise SystemExit(f"training_platform.launch.standby: unknown role {argv[0]!r}: worker or module")


if __name__ == "__main__":
    main(sys.argv[1:])
