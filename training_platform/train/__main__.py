"""`python -m training_platform.train SPEC --run-id ID`: the worker torchrun/srun/Kubernetes starts."""

from __future__ import annotations

import argparse

from training_platform.train.loop import train
from training_platform.train.session import TrainingSession


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training_platform.train")
    parser.add_argument("spec", help="the resolved spec (JSON) the launcher wrote into the run directory")
    parser.add_argument("--run-id", required=True, help="the run (Dagster partition) this process belongs to")
    args = parser.parse_args(argv)
    session = TrainingSession.start(args.spec, args.run_id)
    try:
        train(session)
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            session.reporter.fail(exc)
        raise


if __name__ == "__main__":
    main()
