"""Imported first by the agent's fork server (agent.py preloads it there): the fork server and its workers go with
the agent.

The agent starts its workers through a multiprocessing fork server, a process of its own. The fork server leaves
when its last client is gone, but each worker holds the clients' end of that pipe, and each worker's parent-death
signal is tied to the fork server: so when the agent was killed outright (SIGKILL, the OOM killer's pick), the
fork server, the workers and their checkpoint writers lived on. A local job's shell kills its process group then;
on Slurm, whose process tracking follows parents (proctrack/linuxproc), nothing did, and a job reported FAILED
trained on and saved checkpoints.

Here the fork server asks for SIGHUP when its parent dies, and on it SIGKILLs the workers it forked (not SIGTERM:
a worker would write an emergency checkpoint into a run already reported failed) and exits. A worker resets the
handler it inherits (agent.run_module).
"""

from __future__ import annotations

import os
import signal

import psutil

from training_platform.launch.prctl import signal_on_parent_death

GUARD_SIGNAL = signal.SIGHUP


def _is_fork_server() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            return b"multiprocessing.forkserver" in cmdline.read()
    except OSError:
        return False


def _guard() -> None:
    parent, me = os.getppid(), os.getpid()

    def on_parent_death(signum: int, frame: object) -> None:
        if os.getpid() != me or os.getppid() == parent:
            return  # a worker that kept the handler, or a SIGHUP from elsewhere while the agent lives
        for worker in psutil.Process(me).children():
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                continue
        os._exit(1)

    signal.signal(GUARD_SIGNAL, on_parent_death)
    signal_on_parent_death(GUARD_SIGNAL)
    if os.getppid() != parent:  # the agent died before the line above: no signal will come
        on_parent_death(GUARD_SIGNAL, None)


if _is_fork_server():
    _guard()
