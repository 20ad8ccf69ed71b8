"""Dagster's PostgreSQL run, event-log and schedule storage, with pooled connections that survive a database restart.

Dagster opens a new connection for every use outside the webserver (a `NullPool`). Over a password login (SCRAM,
as a team's database asks) that costs a few milliseconds of CPU each, and a run worker stores a hundred events
per run: about 1.5 s of a run's 12 s on two cores. Here every process keeps one connection per storage (threads
that need more at once get them, closed on return), tests it before handing it out (SQLAlchemy's pre-ping: one
round trip) and reconnects when it is dead, as after a PostgreSQL restart. A connection opened before a fork is
never handed out in the child. The webserver keeps Dagster's own pool (`optimize_for_webserver`), with pre-ping
too: without it `tp` saw "server closed the connection unexpectedly" once per storage after every restart.

`tp server start` names these classes in dagster.yaml when TP_DAGSTER_DATABASE_URL is set
(training_platform/server/local.py).
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

# Connections beyond the one kept open, for threads that store at the same time, are opened as Dagster's own
# NullPool opens them (no limit: a daemon's threads never wait on the pool) and closed when returned.
UNLIMITED_OVERFLOW = -1
RECYCLE_SECONDS = 3600


def pooled_engine(postgres_url: str, token_provider: Any) -> sqlalchemy.engine.Engine:
    """An engine that keeps one tested connection, for this process only (not one it inherited by fork)."""
    engine = create_pg_engine(
        postgres_url,
        token_provider,
        isolation_level="AUTOCOMMIT",
        pool_size=1,
        max_overflow=UNLIMITED_OVERFLOW,
        pool_pre_ping=True,
        pool_recycle=RECYCLE_SECONDS,
    )

    @sqlalchemy.event.listens_for(engine, "connect")
    def _remember_process(dbapi_connection: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @sqlalchemy.event.listens_for(engine, "checkout")
    def _refuse_inherited(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # SQLAlchemy's recipe for pools across fork: the parent's socket must not be used by two processes.
        if record.info["pid"] != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise sqlalchemy.exc.DisconnectionError("a connection opened before a fork; opening a new one")

    return engine


class _Pooled:
    """Built from config as Dagster builds its own classes (which name themselves, not `cls`), pooled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._engine.dispose()  # type: ignore[has-type]  # Dagster's NullPool engine: it holds no connection
        self._engine = pooled_engine(self.postgres_url, self._token_provider)  # type: ignore[attr-defined]

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        self._engine.dispose()  # the connection the pool keeps: an instance's owner closes it here

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any):
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )

    def optimize_for_webserver(self, statement_timeout: int, pool_recycle: int, max_overflow: int) -> None:
        pooled = self._engine
        super().optimize_for_webserver(statement_timeout, pool_recycle, max_overflow)  # type: ignore[misc]
        pooled.dispose()
        pool = self._engine.pool  # type: ignore[attr-defined]
        if not hasattr(pool, "_pre_ping"):  # what create_engine(pool_pre_ping=True) sets
            raise RuntimeError("this SQLAlchemy's pool has no pre-ping switch; update postgres_storage.py for it")
        pool._pre_ping = True


class RunStorage(_Pooled, PostgresRunStorage):
    pass


class EventLogStorage(_Pooled, PostgresEventLogStorage):
    pass


class ScheduleStorage(_Pooled, PostgresScheduleStorage):
    pass
