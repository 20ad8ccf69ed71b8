"""Shared test configuration: each real service has its own fixture module."""

pytest_plugins = ["tests.fixtures.s3", "tests.fixtures.slurm"]


def pytest_configure(config) -> None:
    # Dagster runs in this process too (materialize): the same reason as for `tp` (cli.py).
    from training_platform.cli import keep_stop_signals_deliverable

    keep_stop_signals_deliverable()
