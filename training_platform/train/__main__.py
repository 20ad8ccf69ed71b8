"""`python -m training_platform.train SPEC --run-id ID`: the worker torchrun/srun/Kubernetes starts.

It runs the spec's model template, or the user's own script or module (`entrypoint`), which gets
the same session through `TrainingSession.start()`: launchers never need to know which it is.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import runpy
import sys
from pathlib import Path

from training_platform.spec import EntrypointSpec, parse_spec


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training_platform.train")
    parser.add_argument("spec", help="the resolved spec (JSON) the launcher wrote into the run directory")
    parser.add_argument("--run-id", required=True, help="the run (Dagster partition) this process belongs to")
    args = parser.parse_args(argv)
    # The user's script finds its spec and run through the environment, as in any launcher.
    os.environ["TP_SPEC"], os.environ["TP_RUN_ID"] = os.path.abspath(args.spec), args.run_id
    with open(args.spec) as handle:
        entrypoint = parse_spec(json.load(handle), source=args.spec).entrypoint
    try:
        if entrypoint is None:
            run_template()
        elif entrypoint.script:
            script = script_to_run(entrypoint, Path(args.spec).parent)
            sys.argv = [script, *entrypoint.args]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = [entrypoint.module, *entrypoint.args]
            runpy.run_module(entrypoint.module, run_name="__main__", alter_sys=True)
    except BaseException as exc:
        _report_failure(exc)
        raise
    finally:
        # Metrics still buffered when a script ends without finish() (an early exit, an error) reach MLflow.
        session = _current_session()
        if session is not None:
            session.hooks.reporter.flush_metrics()
    session = _current_session()
    if session is not None and session.hooks.exit_code:  # the script returned after after_step() said to stop
        sys.exit(session.hooks.exit_code)


def script_to_run(entrypoint: EntrypointSpec, run_dir: Path) -> str:
    """The file to run: the script where the spec names it, when that file holds the text shipped with the spec
    (the modules beside it import as before); else the shipped text, written into the run directory (a pod, or
    a machine that never had the file)."""
    code, named = entrypoint.code, Path(entrypoint.script or "")
    if code is None:
        return str(named)
    with contextlib.suppress(OSError):
        if hashlib.sha256(named.read_bytes()).hexdigest() == code.sha256:
            return str(named)
    name = named.name if named.name.endswith(".py") else "script.py"
    shipped = run_dir / "code" / code.sha256 / name
    if not shipped.is_file():  # every rank of the node may write it: the same bytes, staged and renamed
        shipped.parent.mkdir(parents=True, exist_ok=True)
        staged = shipped.with_name(f".{name}.{os.getpid()}")
        staged.write_bytes(code.text.encode())
        os.replace(staged, shipped)
    return str(shipped)


def run_template() -> None:
    from training_platform.train.loop import train
    from training_platform.train.session import TrainingSession

    train(TrainingSession.start())


def _report_failure(exc: BaseException) -> None:
    """Close Dagster Pipes with the exception so the UI shows the user's traceback."""
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return
    session = _current_session()
    if session is None:
        return
    session.hooks.flush()  # a checkpoint the code saved before it failed is not lost
    if not isinstance(exc, SystemExit):
        session.hooks.reporter.fail(exc)


def _current_session():
    """The process's TrainingSession, if the script started one (without importing the SDK otherwise)."""
    session_module = sys.modules.get("training_platform.train.session")
    return session_module.TrainingSession.running() if session_module else None


if __name__ == "__main__":
    main()
