"""`python -m training_platform.launch.agent [torchrun flags] -m MODULE ARGS`: torchrun with pre-imported workers.

torchrun starts every worker as a fresh interpreter that imports torch again before its first
step: 1.5-2 s on a CPU host, paid on every start and every restart after a preemption. This is
torchrun itself (its flags, elastic agent, rendezvous and restarts) with one difference: the
workers come from a fork server that imported torch and the worker's modules while the agent
was starting, so a (re)started group reaches its first step that much sooner.

Why a fork server and not a plain fork of the agent: the agent runs threads (the rendezvous store,
its keep-alive timer), and a worker forked while one of them held a lock can hang on it forever.
The fork server is single-threaded and never initializes CUDA, so its children are safe on GPUs.

On the local launcher it goes one step further: where the run has a warm standby (standby.py: a
spot run's own, or the shared one of a `tp server`), this process only asks it to fork the agent,
and that agent's workers are forked by the standby too, so the attempt imports nothing at all.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import sys
import traceback
from multiprocessing import forkserver
from pathlib import Path

from training_platform.launch import fork_server_guard, standby
from training_platform.launch.prctl import signal_on_parent_death

# What every worker imports before its first step; forked workers find them loaded. torch._dynamo
# is imported by torch's optimizers and by use_deterministic_algorithms: 0.9 s per worker otherwise
# (launch to first step 2.85 -> 2.56 s, 2 ranks, digits); pyarrow.dataset by the first
# pyarrow.parquet.read_table: 0.3 s.
PRELOADED_MODULES = [
    "torch._dynamo",
    "pyarrow.dataset",
    "training_platform.train.session",
    "training_platform.train.loop",
]
FORK_SERVER_GUARD = "training_platform.launch.fork_server_guard"  # the fork server's own: it goes with the agent


def run_module(module: str, *argv: str) -> None:
    """One worker: run MODULE as `python -m MODULE ARGV` would, in the forked process."""
    # The fork server ignores SIGTERM and SIGINT; a worker handles signals like a fresh interpreter.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(fork_server_guard.GUARD_SIGNAL, signal.SIG_DFL)  # the fork server's, not a worker's
    # torch's wrapper interrupts a worker whose parent (the fork server) dies with SIGINT, which
    # would abort an emergency checkpoint; SIGTERM is the signal the worker checkpoints and stops on.
    signal_on_parent_death(signal.SIGTERM)
    if not _parent_forks_workers():  # it died before the line above: no signal will come
        os._exit(1)
    # A fork server's child defaults to starting its own processes through the fork server too
    # (DataLoader workers would then be pickled over to it); start them as a fresh interpreter does.
    multiprocessing.set_start_method(None, force=True)
    # OpenMP read the fork server's environment when torch loaded there; apply this worker's.
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        # A clean exit returns: torch's wrapper reports a worker done only when its function returns.
    except BaseException:
        traceback.print_exc()  # torch records it to an error file; the run's log shows it too
        raise
    finally:
        # The run's work is over; torch's wrapper still waits for the agent to collect the result.
        # A SIGTERM now (a preemption just too late) ends the process instead of the worker's
        # handler noting it and the agent waiting 30 s to SIGKILL it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# What forks workers: the agent's fork server, or a warm standby (standby.py). A worker whose parent is neither
# was reparented: the one that forked it is gone.
_WORKER_PARENTS = (b"multiprocessing.forkserver", b"training_platform.launch.standby")


def _parent_forks_workers() -> bool:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except OSError:
        return False
    return any(parent in command for parent in _WORKER_PARENTS)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # On the local launcher, a warm standby: the run's own (a spot run's), else the shared one.
    standbys = [standby.address(Path.cwd())] if os.environ.get(standby.STANDBY_ENV) else []
    standbys += standby.shared_addresses() if os.environ.get(standby.SHARED_ENV) else []
    for name in standbys:
        status = standby.run_in_standby(name, "agent", argv)
        if status is not None:
            standby.exit_as(status)
    # Started before this process imports torch, so the two imports run side by side. It ignores
    # SIGTERM (an ignored signal stays ignored across exec): a SIGTERM to the job's process group
    # must not take it down under workers still writing their emergency checkpoint. It exits
    # with the agent.
    multiprocessing.set_forkserver_preload([FORK_SERVER_GUARD, *PRELOADED_MODULES, standby.HEAP_FREEZE])
    default_handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    forkserver.ensure_running()
    signal.signal(signal.SIGTERM, default_handler)

    from torch.distributed.elastic.multiprocessing.errors import record

    record(launch)(argv)


def launch(argv: list[str], workers_from_standby: bool = False) -> None:
    """torchrun with ARGV; each worker forked by the fork server, or by the run's standby (standby.py)."""
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    from training_platform.launch import rendezvous

    rendezvous.register()  # the platform's --rdzv-backend (tp-loopback, tp-nodes)
    args = torchrun.parse_args(argv)
    args.rdzv_conf, args.local_addr = rendezvous.for_slurm_task(
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_conf, args.local_addr, os.environ
    )
    if not args.module or args.no_python:
        raise SystemExit("training_platform.launch.agent runs a module: pass `-m MODULE ARGS` after the flags")
    if args.standalone:
        raise SystemExit("use --rdzv-backend=tp-loopback --rdzv-endpoint=127.0.0.1:0 instead of --standalone")
    args.start_method = "forkserver"
    config, _, _ = torchrun.config_from_args(args)
    if workers_from_standby:
        # A command, not a function: torchrun starts it as a subprocess, which asks the standby for the worker.
        command = ("-m", standby.__name__, "worker", args.training_script, *args.training_script_args)
        elastic_launch(config, entrypoint=sys.executable)(*command)
        return
    # By its importable name, not `__main__.run_module`: the fork server unpickles it.
    from training_platform.launch.agent import run_module as entrypoint

    elastic_launch(config, entrypoint=entrypoint)(args.training_script, *args.training_script_args)


if __name__ == "__main__":
    main()
