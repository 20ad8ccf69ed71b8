"""Shared test configuration: each real service has its own fixture module."""

pytest_plugins = ["tests.fixtures.s3", "tests.fixtures.slurm"]
