"""Read-only snapshots of a SQLite ledger through the standard library's ``sqlite3``, for the
CLI: the same :class:`~ledger.store.reads.Reader` and SQL as the store, without importing
SQLAlchemy (a third of a command's start-up, where the answer itself takes milliseconds).

:func:`open_sqlite_snapshot` answers only the plain case: a ``sqlite:///PATH`` URL, a file that
exists, and the schema this code reads. For anything else it returns None and the caller opens
:class:`~ledger.store.Ledger`, so every error message (no file, no schema, an old one, a bad
URL) stays the store's own. The snapshot is what the store's is on SQLite: a deferred read
transaction in WAL mode, which sees one state from its first read to its end.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ledger.errors import LedgerError, LedgerUnavailableError
from ledger.redact import redact_text
from ledger.store.codecs import SCHEMA_HEAD
from ledger.store.reads import Reader

__all__ = ["PlainSource", "open_sqlite_snapshot", "plain_sqlite_path"]

# A URL whose path SQLAlchemy renders back unchanged (no escapes, no query): the status answer
# prints the URL, and must print what the store would.
_PLAIN_URL = re.compile(r"sqlite:///(?P<path>[\w./~+ -]+)")
_BUSY_TIMEOUT_MS = 30_000  # as the store's (ledger.store.connection.SQLITE_BUSY_TIMEOUT_MS)


@dataclass(frozen=True)
class PlainSource:
    """What a CLI answer says of where it read (the store's ``Ledger.backend`` and ``.url``)."""

    backend: str
    url: str


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


def open_sqlite_snapshot(url: str) -> Iterator[tuple[PlainSource, Reader]] | None:
    """A snapshot of the SQLite ledger at ``url`` (a context manager yielding its source and
    reader), or None: not a plain SQLite URL, no such file, or not this code's schema."""
    path = plain_sqlite_path(url)
    if path is None or not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True,
                               isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("BEGIN")
        reader = Reader(_Sqlite3Rows(conn))
        current = reader.schema_revision() == SCHEMA_HEAD
    except sqlite3.Error:
        current = False
    if not current:
        conn.close()
        return None
    return _snapshot(conn, PlainSource("sqlite", url), reader)


@contextmanager
def _snapshot(conn: sqlite3.Connection, source: PlainSource, reader: Reader
              ) -> Iterator[tuple[PlainSource, Reader]]:
    try:
        yield source, reader
    except sqlite3.Error as exc:
        raise _translate(exc) from exc
    finally:
        conn.close()  # the read transaction ends with it


def _translate(exc: sqlite3.Error) -> LedgerError:
    """As the store translates a driver error (ledger.store.connection.translate)."""
    lines = str(exc).strip().splitlines()
    detail = redact_text(lines[0] if lines else type(exc).__name__)
    if isinstance(exc, sqlite3.OperationalError | sqlite3.InterfaceError):
        return LedgerUnavailableError(f"database unavailable: {detail}")
    return LedgerError(f"database error: {detail}")
