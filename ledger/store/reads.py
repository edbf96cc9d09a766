"""Reads on one open connection: head rows, event pages, runs.

:class:`Reader` answers from the transaction its connection is in. The store runs one short
read transaction per call (retried on an outage); a snapshot (``Ledger.snapshot()``) keeps one
transaction open across many calls so that they all see the same state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ledger.store.append import PREV_HASH, chained_prev_hash, row_to_event
from ledger.errors import LedgerError, UnknownRunError
from ledger.events import Event, Head, RunRecord
from ledger.schema import (
    audit_checkpoints,
    digest_hex,
    ledger_events,
    projection_snapshots,
    run_heads,
    runs,
    time_from_stored,
    version_uses,
)

__all__ = ["READ_PAGE", "Reader", "RunSummary"]

READ_PAGE = 1_000
# Built once: building a select costs as much as running it on SQLite, and the rollout path
# reads the head every drain.
_HEAD_ROW = sa.select(run_heads).where(run_heads.c.run_id == sa.bindparam("run_id"))
_HASH_AT = sa.select(ledger_events.c.hash).where(
    ledger_events.c.run_id == sa.bindparam("run_id"), ledger_events.c.seq == sa.bindparam("seq")
)


@dataclass(frozen=True)
class RunSummary:
    """A run as listed by :meth:`Ledger.runs`.

    A damaged run is listed too, never hidden: ``problems`` says what is missing (``no runs
    row``, ``no head row``, ``no events``); without a head row the head fields are None and
    ``last_seq`` is the newest event's seq.
    """

    run_id: str
    created_at: datetime | None
    head_version: int | None
    epoch: int | None
    publisher_cell: str | None
    last_seq: int
    problems: tuple[str, ...] = ()

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    @classmethod
    def of(cls, record: RunRecord) -> RunSummary:
        head = record.head
        return cls(
            run_id=record.run_id,
            created_at=record.created_at,
            head_version=None if head is None else head.version,
            epoch=None if head is None else head.epoch,
            publisher_cell=None if head is None else head.publisher_cell,
            last_seq=head.seq if head is not None else (record.last_event_seq or 0),
            problems=record.problems,
        )


@contextmanager
def _decoding(what: str) -> Iterator[None]:
    """A row the driver returned but could not decode (JSON, time) becomes a LedgerError."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LedgerError(f"{what}: {detail}") from exc


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _record(
    run_id: str, run_row: Any | None, head: Head | None, last_seq: int | None
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        created_at=None if run_row is None else run_row.created_at,
        config=None if run_row is None else _json(run_row.config),
        head=head,
        last_event_seq=last_seq,
    )


# Event pages are read as plain text SQL, without SQLAlchemy's result processing: decoding
# the time and the JSON here is several times cheaper per row, and verify reads every row.
# prev_hash is not stored: a page's rows chain to each other, and its first to the row before
# (read as the page's lead row).
_EVENT_COLUMNS = ("run_id, seq, kind, version, cell_id, epoch, idempotency_key, payload, "
                  "hash, recorded_at, train_step")
_EVENT_PAGE = sa.text(
    f"SELECT {_EVENT_COLUMNS} FROM ledger_events WHERE run_id = :run_id AND seq >= :first "
    "AND seq <= :last ORDER BY seq LIMIT :limit"
)
_USES_FROM = sa.text("SELECT seq, version, train_step, samples FROM version_uses "
                     "WHERE run_id = :run_id AND seq >= :first")
_NO_END = 2**62
# A literal, not a bound parameter: SQLite uses the partial index on batch_trained rows only
# when the query's term matches the index's WHERE as written.
_IS_BATCH = ledger_events.c.kind == sa.literal_column("'batch_trained'")


def _raw_event(row: Any, prev_hash: str) -> Event:
    """An event from a raw row (SQLite: JSON as text, time as integer microseconds;
    PostgreSQL: decoded), chained to ``prev_hash``.

    Raises:
        ValueError, TypeError: corrupt JSON or time.
    """
    (run_id, seq, kind, version, cell_id, epoch, key, payload, digest, recorded_at,
     train_step) = row
    if not isinstance(payload, dict):
        payload = json.loads(payload)
        if not isinstance(payload, dict):
            raise ValueError("payload is not a JSON object")
    return Event(run_id=run_id, seq=seq, kind=kind, payload=payload,
                 recorded_at=time_from_stored(recorded_at), prev_hash=prev_hash,
                 hash=digest_hex(digest), version=version, cell_id=cell_id, epoch=epoch,
                 idempotency_key=key, train_step=train_step)


def head_from_row(row: Any) -> Head:
    """A ``run_heads`` row as a :class:`Head`."""
    return Head(row.head_version, row.epoch, row.publisher_cell, row.last_seq, row.head_hash)


class Reader:
    """Read queries bound to one connection (and so to the transaction it is in)."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def head_row(self, run_id: str) -> sa.Row | None:
        """The run's ``run_heads`` row, or None."""
        with _decoding("corrupt head row in the ledger"):
            return self.conn.execute(_HEAD_ROW, {"run_id": run_id}).first()

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
        lead = 1 if start_seq > 1 else 0  # the row before, for the first event's prev_hash
        rows = self.conn.execute(_EVENT_PAGE, {
            "run_id": run_id, "first": start_seq - lead, "limit": limit + lead,
            "last": end_seq if end_seq is not None else _NO_END,
        })
        page: list[Event] = []
        before: tuple[int, str] | None = None  # (seq, hash) of the row read last
        with _decoding(f"run {run_id!r}: corrupt event row at or after seq {start_seq}"):
            for row in rows:
                seq = row[1]
                hash_before = before[1] if before is not None and before[0] == seq - 1 else None
                if seq >= start_seq:
                    page.append(_raw_event(row, chained_prev_hash(seq, hash_before)))
                before = (seq, digest_hex(row[8]))
        return page[:limit]

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
            sa.select(ledger_events, PREV_HASH).where(
                ledger_events.c.run_id == run_id, ledger_events.c.version == version
            )
        ).first()
        with _decoding(f"run {run_id!r}: corrupt event row at version {version}"):
            return None if row is None else row_to_event(row)

    def event_hash_at(self, run_id: str, seq: int) -> str | None:
        """The stored hash of the event at ``seq`` (None: no such event); one PK lookup."""
        return self.conn.execute(
            _HASH_AT, {"run_id": run_id, "seq": seq}
        ).scalar()

    def batch_at_step(self, run_id: str, train_step: int) -> Event | None:
        """The first ``batch_trained`` event of ``train_step`` (index on kind and step)."""
        row = self.conn.execute(
            sa.select(ledger_events, PREV_HASH)
            .where(ledger_events.c.run_id == run_id,
                   _IS_BATCH, ledger_events.c.train_step == train_step)
            .order_by(ledger_events.c.seq).limit(1)
        ).first()
        with _decoding(f"run {run_id!r}: corrupt batch_trained row of step {train_step}"):
            return None if row is None else row_to_event(row)

    def step_bounds(self, run_id: str) -> tuple[int | None, int | None]:
        """The lowest and highest train step a ``batch_trained`` records (index only)."""
        row = self.conn.execute(
            sa.select(sa.func.min(ledger_events.c.train_step),
                      sa.func.max(ledger_events.c.train_step))
            .where(ledger_events.c.run_id == run_id,
                   _IS_BATCH)
        ).one()
        return row[0], row[1]

    def version_uses(self, run_id: str, version: int) -> list[sa.Row]:
        """(seq, train_step, samples) of every batch that trained on samples of ``version``."""
        return list(self.conn.execute(
            sa.select(version_uses.c.seq, version_uses.c.train_step, version_uses.c.samples)
            .where(version_uses.c.run_id == run_id, version_uses.c.version == version)
            .order_by(version_uses.c.seq)
        ))

    def version_uses_from(self, run_id: str, first_seq: int = 1) -> dict[int, dict[int, tuple]]:
        """seq -> {version: (train_step, samples)} of the run's ``version_uses`` rows with
        ``seq >= first_seq`` (what verify re-derives from the payloads; one range scan)."""
        found: dict[int, dict[int, tuple]] = {}
        for seq, version, train_step, samples in self.conn.execute(_USES_FROM, {
                "run_id": run_id, "first": first_seq}):
            found.setdefault(seq, {})[version] = (train_step, samples)
        return found

    def events_of_kind(self, run_id: str, kind: str, first_seq: int, last_seq: int
                       ) -> list[Event]:
        """Events of one kind with ``first_seq <= seq <= last_seq`` (primary-key range)."""
        query = (sa.select(ledger_events, PREV_HASH)
                 .where(ledger_events.c.run_id == run_id, ledger_events.c.kind == kind,
                        ledger_events.c.seq.between(first_seq, last_seq))
                 .order_by(ledger_events.c.seq))
        with _decoding(f"run {run_id!r}: corrupt {kind} row in seq {first_seq}..{last_seq}"):
            return [row_to_event(row) for row in self.conn.execute(query)]

    def earlier_keys(self, run_id: str, from_seq: int) -> dict[str, int]:
        """key -> seq of every event below ``from_seq`` whose idempotency key an event at or
        after ``from_seq`` holds too (none, unless the unique constraint was lost): one query,
        the later keys never leave the database."""
        later, earlier = ledger_events.alias("later"), ledger_events.alias("earlier")
        # A join driven by the tail (a primary-key range), each key looked up in the unique
        # index: as an IN (subquery), SQLite scans every event of the run instead.
        rows = self.conn.execute(
            sa.select(earlier.c.idempotency_key, earlier.c.seq)
            .select_from(later.join(earlier, sa.and_(
                earlier.c.run_id == later.c.run_id,
                earlier.c.idempotency_key == later.c.idempotency_key)))
            .where(later.c.run_id == run_id, later.c.seq >= from_seq,
                   earlier.c.seq < from_seq)
        )
        return {row.idempotency_key: row.seq for row in rows}

    def latest_snapshot(self, run_id: str, max_seq: int) -> tuple[int, str, Any] | None:
        """(seq, head_hash, state) of the newest read-model snapshot at or below ``max_seq``."""
        return self._latest(projection_snapshots, run_id, max_seq)

    def latest_audit_checkpoint(self, run_id: str, max_seq: int
                                ) -> tuple[int, str, Any] | None:
        """(seq, head_hash, state) of the newest audit checkpoint at or below ``max_seq``."""
        return self._latest(audit_checkpoints, run_id, max_seq)

    def stored_states(self, table: str, run_id: str) -> list[tuple[int, str, Any]]:
        """Every (seq, head_hash, state) of ``projection_snapshots`` or ``audit_checkpoints``
        for the run, in seq order (verify checks each)."""
        chosen = {"projection_snapshots": projection_snapshots,
                  "audit_checkpoints": audit_checkpoints}[table]
        rows = self.conn.execute(
            sa.select(chosen.c.seq, chosen.c.head_hash, chosen.c.state)
            .where(chosen.c.run_id == run_id).order_by(chosen.c.seq)
        )
        with _decoding(f"run {run_id!r}: corrupt {table} row"):
            return [(row.seq, row.head_hash, _json(row.state)) for row in rows]

    def _latest(self, table: sa.Table, run_id: str, max_seq: int
                ) -> tuple[int, str, Any] | None:
        row = self.conn.execute(
            sa.select(table.c.seq, table.c.head_hash, table.c.state)
            .where(table.c.run_id == run_id, table.c.seq <= max_seq)
            .order_by(table.c.seq.desc()).limit(1)
        ).first()
        if row is None:
            return None
        try:
            return row.seq, row.head_hash, _json(row.state)
        except (ValueError, TypeError):
            return None  # an unreadable state is never trusted; verify names it

    def records(self) -> list[RunRecord]:
        """Every run id that any table holds (runs, head rows, events), with what each table
        holds for it, by run id: a run that lost a row, or events whose run is gone, are
        still seen. Three queries, one per table.

        Raises:
            LedgerError: a row that cannot be decoded.
        """
        with _decoding("corrupt row in the ledger"):
            run_rows = {row.run_id: row for row in self.conn.execute(sa.select(runs))}
            heads = {
                row.run_id: head_from_row(row) for row in self.conn.execute(sa.select(run_heads))
            }
            last_seqs = self._last_seqs()
            return [
                _record(run_id, run_rows.get(run_id), heads.get(run_id), last_seqs.get(run_id))
                for run_id in sorted(run_rows.keys() | heads.keys() | last_seqs.keys())
            ]

    def _last_seqs(self) -> dict[str, int]:
        """Run id -> newest seq, for every run id the events hold: one index seek per run
        (the next run id, then its max seq), not a GROUP BY over every event."""
        found: dict[str, int] = {}
        run_id = self.conn.execute(sa.select(sa.func.min(ledger_events.c.run_id))).scalar()
        while run_id is not None:
            found[run_id] = self.conn.execute(
                sa.select(sa.func.max(ledger_events.c.seq))
                .where(ledger_events.c.run_id == run_id)).scalar()
            run_id = self.conn.execute(
                sa.select(sa.func.min(ledger_events.c.run_id))
                .where(ledger_events.c.run_id > run_id)).scalar()
        return found

    def run_record(self, run_id: str) -> RunRecord | None:
        """What the three tables hold for ``run_id`` (None: none of them knows it).

        Raises:
            LedgerError: a row that cannot be decoded.
        """
        with _decoding("corrupt row in the ledger"):
            run_row = self.conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).first()
            head_row = self.head_row(run_id)
            last_seq = self.conn.execute(
                sa.select(sa.func.max(ledger_events.c.seq)).where(
                    ledger_events.c.run_id == run_id
                )
            ).scalar()
            if run_row is None and head_row is None and last_seq is None:
                return None
            head = None if head_row is None else head_from_row(head_row)
            return _record(run_id, run_row, head, last_seq)

    def runs(self) -> list[RunSummary]:
        """Every run, oldest first; damaged runs included (see :class:`RunSummary`), those
        without a ``runs`` row last."""
        summaries = [RunSummary.of(record) for record in self.records()]
        return sorted(
            summaries,
            key=lambda s: (s.created_at is None, s.created_at or datetime.min, s.run_id),
        )

    def newest_run_id(self) -> str | None:
        """The run id of the newest ``runs`` row (one indexed query), or None."""
        with _decoding("corrupt row in the ledger"):
            return self.conn.execute(
                sa.select(runs.c.run_id)
                .order_by(runs.c.created_at.desc(), runs.c.run_id.desc())
                .limit(1)
            ).scalar()

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database."""
        from ledger.migrate import current_revision  # migrate imports the store

        return current_revision(self.conn)
