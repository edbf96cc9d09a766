"""Executors of the Reader's plain SQL: a SQLAlchemy connection (the store's transactions) or
a DB-API connection (:mod:`ledger.store.plain`, the CLI's reads of a SQLite file). Neither
imports SQLAlchemy here: the store passes in a connection it already has."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["Rows", "sqlalchemy_rows"]


class Rows(Protocol):
    """Runs one plain SQL query (``:name`` parameters) and returns its rows as sequences."""

    dialect: str  # "sqlite" or "postgresql"

    def __call__(self, sql: str, params: Mapping[str, Any] | None = None
                 ) -> Iterable[Sequence[Any]]:
        """The query's rows (raw driver values, in column order)."""


class _SqlAlchemyRows:
    """A :class:`Rows` over a SQLAlchemy connection (the store's transactions)."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn
        self.dialect = conn.dialect.name

    def __call__(self, sql: str, params: Mapping[str, Any] | None = None
                 ) -> Iterable[Sequence[Any]]:
        return self.conn.execute(_text(sql), params or {})


_TEXTS: dict[str, Any] = {}


def _text(sql: str) -> Any:
    # Built once per query: building a clause costs as much as running it on SQLite, and the
    # rollout path reads the head every drain.
    clause = _TEXTS.get(sql)
    if clause is None:
        import sqlalchemy as sa

        clause = _TEXTS[sql] = sa.text(sql)
    return clause


def sqlalchemy_rows(conn: sa.Connection) -> Rows:
    """The :class:`Rows` executor of a SQLAlchemy connection."""
    return _SqlAlchemyRows(conn)
