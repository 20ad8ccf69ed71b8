"""The cost ledger as a table of the platform's database (``TP_DATABASE_URL``), shared by every machine.

On a team's deployment the charges are settled by whichever process ends an attempt: a run's Dagster
worker, the preemption sensor, on any machine. A file in one machine's home would split them. Here a
row's key is unique: a charge that another settler wrote first is found, or refused by the database,
and never counted twice. Pooled connections are tested before use, so the ledger outlives a restart of
the database.
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import sqlalchemy as sa

from training_platform.cost.accounting import LedgerQueries, matches, row_key
from training_platform.cost.prices import CostError
from training_platform.state.database import connect, described, failure

_METADATA = sa.MetaData()
LEDGER_TABLE = sa.Table(
    "tp_cost_ledger",
    _METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),  # the order rows were charged in
    sa.Column("key", sa.String(512), nullable=False, unique=True),
    sa.Column("run_id", sa.String(256), nullable=False, index=True),
    sa.Column("team", sa.String(128), nullable=False, index=True),
    sa.Column("row", sa.Text, nullable=False),
)
_ATTEMPTS = 5  # a lost race on a key is settled by looking again; more losses mean something else is wrong


class DatabaseLedger(LedgerQueries):
    def __init__(self, url: str):
        self.url = url
        self.where = described(url)

    def _connect(self) -> sa.Engine:
        try:
            return connect(self.url, _METADATA)
        except sa.exc.SQLAlchemyError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: Exception) -> CostError:
        return CostError(f"the cost ledger in {self.where} failed: {failure(exc)}")

    def record_once(self, rows: list[dict]) -> list[dict]:
        """Insert the rows whose key is not in the ledger yet; returns those written."""
        wanted: dict[str, dict] = {}
        for row in rows:
            wanted.setdefault(row_key(row), row)  # one row per key: the first given
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._connect().begin() as connection:
                    charged = set(
                        connection.execute(
                            sa.select(LEDGER_TABLE.c.key).where(LEDGER_TABLE.c.key.in_(list(wanted)))
                        ).scalars()
                    )
                    new = [row for key, row in wanted.items() if key not in charged]
                    if new:
                        connection.execute(sa.insert(LEDGER_TABLE), [_values(row) for row in new])
                    return new
            # Another settler inserted one of these keys since we looked (or, on SQLite, holds the write lock):
            # look again.
            except (sa.exc.IntegrityError, sa.exc.OperationalError) as exc:
                if attempt == _ATTEMPTS:
                    raise self._unreachable(exc) from None
                time.sleep(0.05 * attempt)
            except sa.exc.SQLAlchemyError as exc:
                raise self._unreachable(exc) from None

    def records(
        self, team: str | None = None, since: datetime | None = None, sweep: str | None = None, run: str | None = None
    ) -> list[dict]:
        query = sa.select(LEDGER_TABLE.c.row).order_by(LEDGER_TABLE.c.id)
        if team is not None:
            query = query.where(LEDGER_TABLE.c.team == team)
        if run is not None:
            query = query.where(LEDGER_TABLE.c.run_id == run)
        try:
            with self._connect().connect() as connection:
                rows = [json.loads(text) for text in connection.execute(query).scalars()]
        except sa.exc.SQLAlchemyError as exc:
            raise self._unreachable(exc) from None
        return [row for row in rows if matches(row, since=since, sweep=sweep)]


def _values(row: dict) -> dict:
    return {"key": row_key(row), "run_id": row["run_id"], "team": row["team"], "row": json.dumps(row)}
