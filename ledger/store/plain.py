"""Read-only snapshots of a ledger through its driver alone (the standard library's ``sqlite3``,
or psycopg2), for the CLI: the same :class:`~ledger.store.reads.Reader` and SQL as the store,
without importing SQLAlchemy (a third of a command's start-up, where the answer itself takes
milliseconds).

On PostgreSQL the CLI reads through psycopg2, not the store's psycopg 3: psycopg 3 imports
asyncio and its whole adapter system, 0.25 s here, against 20 ms for psycopg2 (issue 22: a
read command answers in under 0.3 s, start-up included). Both speak libpq and return the same
Python values for the columns read here (a hash comes back as a memoryview rather than bytes,
which :func:`~ledger.store.codecs.digest_hex` takes either way).

:func:`open_plain_snapshot` answers only the plain case: a ``sqlite:///PATH`` URL and a file
that exists, or a ``postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DB[?KEY=VALUE...]`` URL
written as the store prints it, and the schema this code reads. For anything else it returns None
and the caller opens :class:`~ledger.store.Ledger`, so every error message (no file, no
schema, an old one, a bad URL) stays the store's own; a server that does not answer is
reported by the store itself (the plain path does not connect twice: it leaves that case to the
store). The snapshot is what the store's is: on SQLite a deferred read transaction in WAL mode,
which sees one state from its first read to its end; on PostgreSQL ``REPEATABLE READ READ
ONLY``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus

from ledger.errors import LedgerError, driver_error
from ledger.redact import redact_text
from ledger.store.codecs import SCHEMA_HEAD
from ledger.store.reads import Reader
from ledger.store.rows import Rows

__all__ = ["PlainSource", "open_plain_snapshot", "plain_postgres_args", "plain_sqlite_path"]

# A URL whose path SQLAlchemy renders back unchanged (no escapes, no query): the status answer
# prints the URL, and must print what the store would.
_PLAIN_URL = re.compile(r"sqlite:///(?P<path>[\w./~+ -]+)")
_BUSY_TIMEOUT_MS = 30_000  # as the store's (ledger.store.connection.SQLITE_BUSY_TIMEOUT_MS)
_WORD = r"[\w.-]+"
_PLAIN_PG_URL = re.compile(
    rf"postgresql\+psycopg://(?P<user>{_WORD})(?::(?P<password>[^@/?#\s]+))?"
    rf"@(?P<host>{_WORD})(?::(?P<port>\d+))?/(?P<dbname>{_WORD})(?:\?(?P<query>\S+))?")
Snapshot = AbstractContextManager[tuple["PlainSource", Reader]]


@dataclass(frozen=True)
class PlainSource:
    """What a CLI answer says of where it read (the store's ``Ledger.backend`` and ``.url``)."""

    backend: str
    url: str


class _PsycopgRows:
    """A :class:`~ledger.store.rows.Rows` over a psycopg2 connection (``:name`` parameters
    rewritten to its ``%(name)s``, once per query)."""

    dialect = "postgresql"
    _converted: dict[str, str] = {}

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __call__(self, sql: str, params: Mapping[str, Any] | None = None
                 ) -> Iterable[Sequence[Any]]:
        converted = self._converted.get(sql)
        if converted is None:
            converted = self._converted[sql] = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))
        cursor = self.conn.cursor()
        cursor.execute(converted, params or {})
        return cursor


_NAMED = re.compile(r"(?<![:\w]):(\w+)")


class _Sqlite3Rows:
    """A :class:`~ledger.store.rows.Rows` over a ``sqlite3`` connection."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __call__(self, sql: str, params: Mapping[str, Any] | None = None
                 ) -> Iterable[Sequence[Any]]:
        return self.conn.execute(sql, params or {})


def plain_sqlite_path(url: str) -> Path | None:
    """The file of a plain ``sqlite:///PATH`` URL, else None."""
    matched = _PLAIN_URL.fullmatch(url)
    return None if matched is None else Path(matched["path"])


def open_plain_snapshot(url: str) -> Snapshot | None:
    """A snapshot of the ledger at ``url`` (a context manager yielding its source and reader),
    or None: not a plain URL, no such file, not this code's schema, or a PostgreSQL server
    that did not answer (the store reports that in its own words).
    """
    if url.startswith("sqlite"):
        return _open_sqlite(url)
    if url.startswith("postgresql"):
        return _open_postgres(url)
    return None


def plain_postgres_args(url: str) -> tuple[dict[str, Any], str] | None:
    """libpq's connection arguments for a plain PostgreSQL URL and the URL as the store
    prints it (password masked), else None: a URL the store would print otherwise (options
    not in order, or not quoted as it quotes them) is not plain."""
    matched = _PLAIN_PG_URL.fullmatch(url)
    if matched is None:
        return None
    args: dict[str, Any] = {"user": matched["user"], "host": matched["host"],
                            "dbname": matched["dbname"]}
    if matched["port"]:
        args["port"] = int(matched["port"])
    printed = url
    if matched["password"] is not None:
        args["password"] = unquote(matched["password"])
        printed = url.replace(f":{matched['password']}@", ":***@", 1)
    if matched["query"]:
        pairs = [pair.split("=", 1) for pair in matched["query"].split("&")]
        if any(len(pair) != 2 or quote_plus(unquote_plus(pair[1])) != pair[1]
               for pair in pairs):
            return None
        options = dict(parse_qsl(matched["query"], strict_parsing=True))
        if list(options) != sorted(options) or len(options) != len(pairs) \
                or options.keys() & args.keys():
            return None
        args.update(options)
    return args, redact_text(printed)


def _open_postgres(url: str) -> Snapshot | None:
    found = plain_postgres_args(url)
    if found is None:
        return None
    args, printed = found
    try:
        import psycopg2
    except ImportError:  # an install without it reads through the store
        return None
    try:
        conn = psycopg2.connect(**args)
    except psycopg2.Error:
        return None  # the store connects, retries, and says what went wrong in its own words

    def begin() -> None:  # psycopg2 begins the transaction at the first query
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)

    return _if_current(conn, begin, _PsycopgRows(conn), PlainSource("postgresql", printed),
                       psycopg2.Error)


def _open_sqlite(url: str) -> Snapshot | None:
    path = plain_sqlite_path(url)
    if path is None or not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True,
                               isolation_level=None)
    except sqlite3.Error:
        return None

    def begin() -> None:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("BEGIN")

    return _if_current(conn, begin, _Sqlite3Rows(conn), PlainSource("sqlite", url),
                       sqlite3.Error)


def _if_current(conn: Any, begin: Callable[[], None], rows: Rows, source: PlainSource,
                driver_error: type[Exception]) -> Snapshot | None:
    """The snapshot on ``conn`` once its transaction has begun, if the database holds this
    code's schema; else None (and the connection closed)."""
    try:
        begin()
        reader = Reader(rows)
        current = reader.schema_revision() == SCHEMA_HEAD
    except driver_error:
        current = False
    if not current:
        conn.close()
        return None
    return _snapshot(conn, source, reader, driver_error)


@contextmanager
def _snapshot(conn: Any, source: PlainSource, reader: Reader, driver_error: type[Exception]
              ) -> Iterator[tuple[PlainSource, Reader]]:
    try:
        yield source, reader
    except driver_error as exc:
        raise _translate(exc) from exc
    finally:
        conn.close()  # the read transaction ends with it


def _translate(exc: Exception) -> LedgerError:
    """As the store translates a driver error (ledger.store.connection.translate): the
    DB-API's OperationalError and InterfaceError mean the database is unavailable."""
    return driver_error(exc, unavailable=any(
        base.__name__ in ("OperationalError", "InterfaceError") for base in type(exc).__mro__))
