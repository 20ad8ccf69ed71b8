"""Runs starting at once on a new platform home share one MLflow SQLite store: it is created once, not raced.

Without the lock, three of four processes failed here with `table _alembic_tmp_experiments already exists`.
"""

import multiprocessing

from training_platform.registry.tracking import ensure_experiment


def _first_use(uri: str, artifacts: str, barrier) -> None:
    from pathlib import Path

    barrier.wait()  # all four reach MLflow's first use of the new store together
    ensure_experiment(uri, "qa/race", Path(artifacts))


def test_four_processes_creating_the_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    workers = [context.Process(target=_first_use, args=(uri, str(tmp_path), barrier)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
