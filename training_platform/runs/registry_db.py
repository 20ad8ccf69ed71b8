"""The run registry as a table of the platform's database (``TP_DATABASE_URL``), shared by every machine."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import sqlalchemy as sa

from training_platform.errors import SharedStateError
from training_platform.identifiers import check_run_id
from training_platform.runs.registry import RunRegistry
from training_platform.state.database import connect, described, shared_state_failures

_METADATA = sa.MetaData()
RUNS_TABLE = sa.Table(
    "tp_runs",
    _METADATA,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("team", sa.String(128), nullable=False, index=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("trial", sa.Text, nullable=True),  # a sweep trial's context
)


class DatabaseRunRegistry(RunRegistry):
    def __init__(self, url: str):
        self.url = url
        self.where = described(url)

    def add(self, run_id: str, team: str, spec_json: str, trial_json: str | None = None) -> str:
        row = {"run_id": check_run_id(run_id), "team": team, "created_at": datetime.now(UTC), "spec": spec_json,
               "trial": trial_json}
        with self._failures():
            try:
                with connect(self.url, _METADATA).begin() as connection:
                    connection.execute(sa.insert(RUNS_TABLE), [row])
            except sa.exc.IntegrityError:  # registered already, maybe a moment ago by another machine
                pass
        recorded = self.get(run_id)
        if recorded is None:  # the insert failed on something else than the key
            raise SharedStateError(f"run {run_id!r} could not be registered in {self.where}; submit it again")
        return recorded

    def get(self, run_id: str) -> str | None:
        return self._one(RUNS_TABLE.c.spec, run_id)

    def trial(self, run_id: str) -> str | None:
        return self._one(RUNS_TABLE.c.trial, run_id)

    def _one(self, column: sa.Column, run_id: str) -> str | None:
        query = sa.select(column).where(RUNS_TABLE.c.run_id == check_run_id(run_id))
        with self._failures(), connect(self.url, _METADATA).connect() as connection:
            return connection.execute(query).scalar_one_or_none()

    def specs(self) -> dict[str, str]:
        query = sa.select(RUNS_TABLE.c.run_id, RUNS_TABLE.c.spec).order_by(RUNS_TABLE.c.run_id)
        with self._failures(), connect(self.url, _METADATA).connect() as connection:
            return {run_id: spec for run_id, spec in connection.execute(query)}

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        return shared_state_failures(f"the run registry in {self.where}")
