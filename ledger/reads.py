"""Reads on one open connection: head rows, event pages, runs.

:class:`Reader` answers from the transaction its connection is in. The store runs one short
read transaction per call (retried on an outage); a snapshot (``Ledger.snapshot()``) keeps one
transaction open across many calls so that they all see the same state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ledger.append import row_to_event
from ledger.errors import LedgerError, UnknownRunError
from ledger.events import Event, Head
from ledger.migrate import current_revision
from ledger.schema import ledger_events, run_heads, runs

__all__ = ["READ_PAGE", "Reader", "RunSummary"]

READ_PAGE = 1_000


@dataclass(frozen=True)
class RunSummary:
    """A run as listed by :meth:`Ledger.runs`."""

    run_id: str
    created_at: datetime
    head_version: int
    epoch: int
    publisher_cell: str | None
    last_seq: int


@contextmanager
def _decoding(what: str) -> Iterator[None]:
    """A row the driver returned but could not decode (JSON, time) becomes a LedgerError."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LedgerError(f"{what}: {detail}") from exc


def head_from_row(row: Any) -> Head:
    """A ``run_heads`` row as a :class:`Head`."""
    return Head(row.head_version, row.epoch, row.publisher_cell, row.last_seq, row.head_hash)


class Reader:
    """Read queries bound to one connection (and so to the transaction it is in)."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def head_row(self, run_id: str) -> sa.Row | None:
        """The run's ``run_heads`` row, or None."""
        return self.conn.execute(
            sa.select(run_heads).where(run_heads.c.run_id == run_id)
        ).first()

    def head(self, run_id: str) -> Head:
        """The run's head row.

        Raises:
            UnknownRunError: the run has no head row.
        """
        row = self.head_row(run_id)
        if row is None:
            raise UnknownRunError(run_id)
        return head_from_row(row)

    def event_page(
        self, run_id: str, start_seq: int, end_seq: int | None, limit: int = READ_PAGE
    ) -> list[Event]:
        """Up to ``limit`` events with ``start_seq <= seq <= end_seq``, in seq order.

        Raises:
            LedgerError: a row that cannot be decoded (corrupt JSON or time).
        """
        query = (
            sa.select(ledger_events)
            .where(ledger_events.c.run_id == run_id, ledger_events.c.seq >= start_seq)
            .order_by(ledger_events.c.seq)
            .limit(limit)
        )
        if end_seq is not None:
            query = query.where(ledger_events.c.seq <= end_seq)
        with _decoding(f"run {run_id!r}: corrupt event row at or after seq {start_seq}"):
            return [row_to_event(row) for row in self.conn.execute(query)]

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterator[Event]:
        """Events of ``run_id`` in seq order, read in pages in this transaction.

        Raises:
            LedgerError: a row that cannot be decoded.
        """
        next_seq = start_seq
        while end_seq is None or next_seq <= end_seq:
            page = self.event_page(run_id, next_seq, end_seq)
            yield from page
            if len(page) < READ_PAGE:
                return
            next_seq = page[-1].seq + 1

    def event_at_version(self, run_id: str, version: int) -> Event | None:
        """The ``weight_committed`` event of ``version``, or None."""
        row = self.conn.execute(
            sa.select(ledger_events).where(
                ledger_events.c.run_id == run_id, ledger_events.c.version == version
            )
        ).first()
        with _decoding(f"run {run_id!r}: corrupt event row at version {version}"):
            return None if row is None else row_to_event(row)

    def runs(self) -> list[RunSummary]:
        """Every run, oldest first."""
        query = (
            sa.select(runs.c.run_id, runs.c.created_at, run_heads)
            .join(run_heads, run_heads.c.run_id == runs.c.run_id)
            .order_by(runs.c.created_at, runs.c.run_id)
        )
        with _decoding("corrupt row in the ledger"):
            return [
                RunSummary(
                    run_id=row.run_id,
                    created_at=row.created_at,
                    head_version=row.head_version,
                    epoch=row.epoch,
                    publisher_cell=row.publisher_cell,
                    last_seq=row.last_seq,
                )
                for row in self.conn.execute(query)
            ]

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database."""
        return current_revision(self.conn)
