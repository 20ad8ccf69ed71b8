"""Dagster instance plumbing of the platform (loaded by the webserver and daemon from dagster.yaml)."""
