"""Run records of the platform server's training runs, for `tp status` and `tp metrics`.

The server says what is queued, running and finished (over GraphQL: no Dagster import in the
client); each run's own telemetry in the home adds progress, utilization and cost so far.
"""

from __future__ import annotations

from training_platform.client.graphql import PlatformClient
from training_platform.paths import PlatformHome
from training_platform.telemetry.records import RunRecord, orchestrated_record

RECORDS_LIMIT = 500


def server_run_records(client: PlatformClient, home: PlatformHome, limit: int = RECORDS_LIMIT) -> list[RunRecord]:
    """One record per Dagster run that trains a platform run, newest first."""
    return [
        orchestrated_record(home, run.partition, run.status, run.created, run.ended, run.team, run.id)
        for run in client.runs(limit=limit)
        if run.trains and run.partition
    ]
