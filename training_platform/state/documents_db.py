"""The platform's shared records as rows of `tp_documents` in its database (``TP_DATABASE_URL``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from training_platform.identifiers import check_run_id
from training_platform.state.database import connect, described, shared_state_failures
from training_platform.state.documents import Documents, file_lock

_METADATA = sa.MetaData()
DOCUMENTS_TABLE = sa.Table(
    "tp_documents",
    _METADATA,
    sa.Column("kind", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)
_WRITE_ATTEMPTS = 5  # a lost race between two first writes of a name is settled by writing again


class DatabaseDocuments(Documents):
    def __init__(self, url: str, kind: str, lock_dir: Path):
        self.url = url
        self.kind = kind
        self.lock_dir = lock_dir  # where a database without advisory locks (SQLite: one machine) takes its locks
        self.shown = described(url)

    def where(self, name: str) -> str:
        return f"{self.kind} record {name!r} in {self.shown}"

    def get(self, name: str) -> dict[str, Any] | None:
        table = DOCUMENTS_TABLE
        query = sa.select(table.c.body).where(table.c.kind == self.kind, table.c.name == self._checked(name))
        with self._failures(), self._engine().connect() as connection:
            body = connection.execute(query).scalar_one_or_none()
        return json.loads(body) if body is not None else None

    def put(self, name: str, record: dict[str, Any]) -> None:
        table = DOCUMENTS_TABLE
        key = (table.c.kind == self.kind, table.c.name == self._checked(name))
        values = {"updated_at": datetime.now(UTC), "body": json.dumps(record)}
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            with self._failures():
                try:
                    with self._engine().begin() as connection:
                        if connection.execute(sa.update(table).where(*key).values(**values)).rowcount == 0:
                            connection.execute(sa.insert(table).values(kind=self.kind, name=name, **values))
                    return
                except sa.exc.IntegrityError:  # another writer inserted the name first: update it now
                    if attempt == _WRITE_ATTEMPTS:
                        raise

    def names(self) -> list[str]:
        table = DOCUMENTS_TABLE
        query = sa.select(table.c.name).where(table.c.kind == self.kind).order_by(table.c.name)
        with self._failures(), self._engine().connect() as connection:
            return list(connection.execute(query).scalars())

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        engine = self._engine()
        if engine.dialect.name != "postgresql":
            with file_lock(self.lock_dir / f"{self.kind}.{self._checked(name)}.lock"):
                yield
            return
        # A session-level advisory lock, held by one connection for the block: released with the connection, so
        # a holder that dies never blocks the record for good.
        key = int.from_bytes(hashlib.sha256(f"{self.kind}/{self._checked(name)}".encode()).digest()[:8], "big",
                             signed=True)
        with contextlib.ExitStack() as stack:
            with self._failures():
                connection = stack.enter_context(engine.connect())
                connection.execute(sa.select(sa.func.pg_advisory_lock(key)))
                connection.commit()
            try:
                yield
            finally:
                try:
                    connection.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                    connection.commit()
                except sa.exc.SQLAlchemyError:
                    connection.invalidate()  # never back to the pool still holding the lock

    def _checked(self, name: str) -> str:
        return check_run_id(name, f"{self.kind} name")

    def _engine(self) -> sa.Engine:
        with self._failures():
            return connect(self.url, _METADATA)

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        return shared_state_failures(f"reading or writing the {self.kind} records in {self.shown}")
