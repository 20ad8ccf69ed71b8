"""Dagster's SQLite run, event-log and schedule storage, each keeping its connections open between uses.

Dagster's SQLite storages create a new engine, and open a new connection, at every use (a `NullPool`): each
query pays for the engine, the connection and SQL compiled afresh (an engine's compile cache dies with it). The
daemon's sensor loop reads the sensors' states every half second and a tick writes them, the queue reads queued
runs four times a second, a run's process stores a hundred events, the webserver answers `tp`'s polls. Measured on
an idle home: reading the sensors' states took 5.2 ms of CPU with Dagster's connect, 1.2 ms here; the queue's read
of queued runs 1.6 -> 0.3 ms; storing an event 2.6 -> 0.6 ms.

Here each process keeps an engine per database file, with one connection kept open (threads that need more at
once get them, closed on return, as under Dagster's NullPool). The event log is a file per run and an index: the
index and the KEPT_RUN_FILES run files used last stay open. A connection opened before a fork is never used in the
child: the child opens its own (the code server forks its runs). Same files, same schema: `tp server start` names
these classes in the instance config (training_platform/server/local.py) in place of Dagster's default SQLite
storage, over the same directories (`history/runs.db`, `history/runs/`, `schedules/schedules.db` under the Dagster
home).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import sqlalchemy
from dagster import StringSource
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME
from dagster._core.storage.runs import SqliteRunStorage
from dagster._core.storage.schedules import SqliteScheduleStorage
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS  # Dagster's wait on a locked event log
from dagster._serdes import ConfigurableClassData

# Beyond the kept connection, a thread that needs one while another holds it opens its own, as under Dagster's
# NullPool: no limit, so no thread of the daemon ever waits on the pool; the extra ones close on return.
UNLIMITED_OVERFLOW = -1
# Run files of the event log kept open: a run's process uses one, the webserver the few runs `tp` follows.
KEPT_RUN_FILES = 16


class _ProcessEngines:
    """This process's engines, by database URL; beyond LIMIT, the one used least recently is closed."""

    def __init__(self, limit: int | None = None, **connect_args: Any):
        self._limit = limit
        self._connect_args = connect_args
        # Keyed by process: a child of a fork finds its parent's engines here and never touches them (two processes
        # must not share one SQLite connection); they are kept, not closed, so the child's exit does not close them.
        self._by_process: dict[int, OrderedDict[str, sqlalchemy.engine.Engine]] = {}
        self._lock = threading.Lock()  # the daemon's and the webserver's threads share a storage

    def get(self, url: str) -> sqlalchemy.engine.Engine:
        with self._lock:
            engines = self._by_process.setdefault(os.getpid(), OrderedDict())
            if url in engines:
                engines.move_to_end(url)
                return engines[url]
            engines[url] = create_engine(
                url,
                poolclass=sqlalchemy.pool.QueuePool,
                pool_size=1,
                max_overflow=UNLIMITED_OVERFLOW,
                connect_args=self._connect_args,
            )
            if self._limit is not None and len(engines) > self._limit:
                engines.popitem(last=False)[1].dispose()
            return engines[url]

    def dispose(self) -> None:
        """Close this process's connections (an instance's owner closes them when it closes the instance)."""
        with self._lock:
            engines = self._by_process.pop(os.getpid(), {})
        for engine in engines.values():
            engine.dispose()


class _InDagsterHome:
    """Configured as Dagster's `storage: sqlite` is: by the Dagster home, under which each storage has its files."""

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"base_dir": StringSource}


class _KeptConnection(_InDagsterHome):
    """`connect()` over an engine of this process that keeps a connection open; Dagster's transaction around each."""

    _conn_string: str
    _kept_engines: _ProcessEngines

    def _engine(self) -> sqlalchemy.engine.Engine:
        if "_kept_engines" not in self.__dict__:  # Dagster's __init__ knows nothing of it
            self._kept_engines = _ProcessEngines()
        return self._kept_engines.get(self._conn_string)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlalchemy.engine.Connection]:
        with self._engine().connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        if "_kept_engines" in self.__dict__:
            self._kept_engines.dispose()


class RunStorage(_KeptConnection, SqliteRunStorage):
    """Runs in BASE_DIR/history/runs.db, where Dagster's default SQLite storage keeps them."""

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> RunStorage:
        return cls.from_local(os.path.join(config_value["base_dir"], "history"), inst_data=inst_data)


class ScheduleStorage(_KeptConnection, SqliteScheduleStorage):
    """Sensor and schedule states and ticks in BASE_DIR/schedules/schedules.db, where Dagster's default keeps them."""

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> ScheduleStorage:
        return cls.from_local(os.path.join(config_value["base_dir"], "schedules"), inst_data=inst_data)


class EventLogStorage(_InDagsterHome, SqliteEventLogStorage):
    """Event logs in BASE_DIR/history/runs/ (a file per run, and the index), where Dagster's default keeps them."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._kept_index = _ProcessEngines(timeout=SQLITE_BUSY_TIMEOUT_SECONDS)
        self._kept_runs = _ProcessEngines(KEPT_RUN_FILES, timeout=SQLITE_BUSY_TIMEOUT_SECONDS)
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> EventLogStorage:
        return cls(os.path.join(config_value["base_dir"], "history", "runs"), inst_data=inst_data)

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[sqlalchemy.engine.Connection]:
        # Dagster's _connect with a kept engine: one use at a time (its lock), the file created at its first use.
        with self._db_lock:
            kept = self._kept_index if shard == INDEX_SHARD_NAME else self._kept_runs
            engine = kept.get(self.conn_string_for_shard(shard))
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def wipe(self) -> None:
        with self._db_lock:
            self._kept_runs.dispose()  # no connection stays open on a file the wipe deletes
        super().wipe()

    def dispose(self) -> None:
        super().dispose()
        self._kept_runs.dispose()
        self._kept_index.dispose()
