"""The platform's database (``TP_DATABASE_URL``): what every machine of a team's deployment shares.

Its tables (the run registry, the cost ledger, the shared records of documents_db.py) are created on first
use. Connections are pooled per process (a forked process opens its own) and tested before use, so a restart
of the database costs a reconnect, not the caller's request.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import sqlalchemy as sa

from training_platform.errors import SharedStateError
from training_platform.paths import DATABASE_ENV


def connect(url: str, metadata: sa.MetaData) -> sa.Engine:
    """The process's engine for `url`, with `metadata`'s tables created if they are not there."""
    engine = _engine(url, os.getpid())
    _create_tables(engine, metadata)
    return engine


def shown(url: str) -> str:
    """`url` as errors and logs may show it: without its password."""
    return sa.make_url(url).render_as_string(hide_password=True)


def described(url: str) -> str:
    """The platform's database as a message names it: its URL without the password, and the setting."""
    return f"the platform's database {shown(url)} ({DATABASE_ENV})"


def failure(exc: Exception) -> str:
    """The first line of a database error: what went wrong, without the statement and its parameters."""
    return str(exc).splitlines()[0]


@contextlib.contextmanager
def shared_state_failures(what: str) -> Iterator[None]:
    """A database error in the block as a SharedStateError: what failed (WHAT, naming the database without its
    password), why, and what to check."""
    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        raise SharedStateError(
            f"{what} failed: {failure(exc)}; check that the database is up and its URL is right "
            "(`deploy/team/local-stack.sh status` on the team stack)"
        ) from None


@functools.lru_cache(maxsize=4)
def _engine(url: str, _pid: int) -> sa.Engine:
    return sa.create_engine(url, pool_pre_ping=True)


@functools.lru_cache(maxsize=16)
def _create_tables(engine: sa.Engine, metadata: sa.MetaData) -> None:
    metadata.create_all(engine)  # once per process and table set; an existing table is left as it is
