"""Dagster's PostgreSQL run, event-log and schedule storage, whose webserver connection survives a database restart.

In the webserver, Dagster keeps one pooled connection per storage open (`optimize_for_webserver`). After
PostgreSQL restarts, that connection is dead, and the next request on it fails ("server closed the
connection unexpectedly") before the pool replaces it: `tp` saw that error once per storage after every
restart. Here the pool tests a connection before handing it out (SQLAlchemy's pre-ping: one round trip)
and reconnects when it is dead. The daemon and the code server open a connection per use; nothing changes there.

`tp server start` names these classes in dagster.yaml when TP_DAGSTER_DATABASE_URL is set (server.py).
"""

from __future__ import annotations

from typing import Any

from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config


class _PingedInWebserver:
    """Built from config as Dagster builds its own classes (which name themselves, not `cls`), with pre-ping."""

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any):
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )

    def optimize_for_webserver(self, statement_timeout: int, pool_recycle: int, max_overflow: int) -> None:
        super().optimize_for_webserver(statement_timeout, pool_recycle, max_overflow)  # type: ignore[misc]
        pool = self._engine.pool  # type: ignore[attr-defined]
        if not hasattr(pool, "_pre_ping"):  # what create_engine(pool_pre_ping=True) sets
            raise RuntimeError("this SQLAlchemy's pool has no pre-ping switch; update postgres_storage.py for it")
        pool._pre_ping = True


class RunStorage(_PingedInWebserver, PostgresRunStorage):
    pass


class EventLogStorage(_PingedInWebserver, PostgresEventLogStorage):
    pass


class ScheduleStorage(_PingedInWebserver, PostgresScheduleStorage):
    pass
