"""Engines and transactions: URL checks, SQLite pragmas, and the one translation of driver errors.

Everything the ledger does with a database goes through :func:`transaction`. Its exit is the
one place where a driver error (SQLAlchemy, sqlite3, psycopg) becomes the ledger's own
(:func:`translate`), so callers above this module only ever see :class:`LedgerError` and its
subclasses.

Three kinds of transaction:

- ``read``: one short read (``BEGIN`` on SQLite, the default isolation on PostgreSQL);
- ``write``: the append path. SQLite opens it with ``BEGIN IMMEDIATE`` (the database write
  lock, in WAL mode so readers are not blocked); PostgreSQL locks the run's head row itself
  (see :mod:`ledger.store.append`);
- ``snapshot``: many reads that must agree with each other (an audit, a CLI answer).
  PostgreSQL runs it ``REPEATABLE READ READ ONLY``; SQLite's deferred read transaction in WAL
  mode already sees one snapshot from its first read to its end.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event as sa_event

from ledger.errors import LedgerError, LedgerUnavailableError, driver_error
from ledger.events import compact_json
from ledger.redact import redact_text, redact_url

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "TransactionKind",
    "create_engine",
    "normalise_url",
    "run_with_retries",
    "transaction",
    "translate",
]

log = logging.getLogger("ledger.store")

SQLITE_BUSY_TIMEOUT_MS = 30_000
_T = TypeVar("_T")

TransactionKind = Literal["read", "write", "snapshot"]


def normalise_url(url: str) -> sa.URL:
    """Parse ``url`` and check it names a durable SQLite file or a PostgreSQL database.

    A ``postgresql://`` or ``postgresql+psycopg2://`` URL is moved to psycopg 3.

    Raises:
        LedgerError: not a URL, another backend, or an in-memory SQLite database.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise LedgerError(
            f"not a database URL: {redact_text(url)!r} (use sqlite:///PATH or "
            "postgresql+psycopg://...)"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise LedgerError(
            f"unsupported database {backend!r} in {redact_url(parsed)!r}: use sqlite:///PATH "
            "or postgresql+psycopg://USER@HOST/DB"
        )
    if backend == "postgresql" and parsed.get_driver_name() in ("psycopg2", ""):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise LedgerError("an in-memory SQLite database cannot hold a durable ledger")
    return parsed


def create_engine(url: sa.URL, readonly: bool) -> sa.Engine:
    """An engine for ``url``; a ``readonly`` one never creates a file or takes a write lock.

    Raises:
        LedgerError: a reader's SQLite file does not exist.
    """
    if url.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, pool_pre_ping=True, json_serializer=compact_json)
        if readonly:
            engine = engine.execution_options(postgresql_readonly=True)
        return engine
    return _create_sqlite_engine(Path(url.database), readonly)


def _create_sqlite_engine(path: Path, readonly: bool) -> sa.Engine:
    if readonly:
        if not path.is_file():
            raise LedgerError(f"no ledger database at {path}")
        # mode=ro: a reader never creates the file, a table, or takes the write lock.
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        engine = sa.create_engine(
            "sqlite://", json_serializer=compact_json,
            creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False),
        )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            f"sqlite:///{path}", connect_args={"check_same_thread": False},
            json_serializer=compact_json,
        )

    @sa_event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE below is really ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if not readonly:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @sa_event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        immediate = connection.get_execution_options().get("ledger_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def translate(exc: Exception) -> LedgerError:
    """Map a driver error to the ledger's own; called only at a transaction's exit.

    The message is the driver's first line, with any credential redacted (a driver may echo
    its connection string).
    """
    return driver_error(getattr(exc, "orig", exc), unavailable=isinstance(
        exc, sa.exc.OperationalError | sa.exc.InterfaceError))


@contextmanager
def transaction(engine: sa.Engine, kind: TransactionKind = "read") -> Iterator[sa.Connection]:
    """One transaction on a pooled connection: committed on success, rolled back on error.

    Raises:
        LedgerUnavailableError: the database could not be reached (or stayed locked).
        LedgerError: any other driver error; a :class:`LedgerError` raised inside passes as is.
    """
    try:
        with engine.connect() as raw:
            conn = raw
            if kind == "write":
                conn = raw.execution_options(ledger_write=True)
            elif kind == "snapshot" and raw.dialect.name == "postgresql":
                conn = raw.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            with conn.begin():
                yield conn
    except LedgerError:
        raise
    except sa.exc.SQLAlchemyError as exc:
        raise translate(exc) from exc


def run_with_retries(
    retry_seconds: float, operation: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """Run ``operation`` (one whole transaction), retrying only :class:`LedgerUnavailableError`
    with jittered exponential backoff for up to ``retry_seconds``; the last error is re-raised.

    Safe only for an operation that is a read, or a write with an idempotency key.
    """
    name = getattr(operation, "__name__", "operation").lstrip("_")
    try:
        # The common case skips the retry machinery: a tenacity loop adds ~15% to a head
        # read on SQLite, which the rollout path makes every drain.
        return operation(*args, **kwargs)
    except LedgerUnavailableError as exc:
        log.warning("ledger %s failed (%s); retrying", name, exc)
    # Imported on the first retry: most processes never retry, and a CLI read pays for imports.
    from tenacity import (Retrying, retry_if_exception_type, stop_after_delay,
                          wait_exponential_jitter)

    retrying = Retrying(
        retry=retry_if_exception_type(LedgerUnavailableError),
        wait=wait_exponential_jitter(initial=0.05, max=2.0),
        stop=stop_after_delay(retry_seconds),
        reraise=True,
        before_sleep=lambda state: log.warning(
            "ledger %s failed (%s); retrying", name,
            state.outcome.exception() if state.outcome else None,
        ),
    )
    return retrying(operation, *args, **kwargs)
