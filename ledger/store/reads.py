"""Reads on one open connection: head rows, event pages, runs, as plain SQL.

:class:`Reader` answers from the transaction its connection is in. The store runs one short
read transaction per call (retried on an outage); a snapshot (``Ledger.snapshot()``) keeps one
transaction open across many calls so that they all see the same state.

Every query is plain SQL text with ``:name`` parameters, run through a :class:`Rows`
executor: SQLAlchemy's connection for the store (:func:`sqlalchemy_rows`), or a DB-API
connection for the CLI's reads of a SQLite file (:mod:`ledger.store.plain`), which then never
import SQLAlchemy. Rows come back as the driver returns them and are decoded here
(:mod:`ledger.store.codecs`): on SQLite, JSON as text, hashes as bytes, event times as integer
microseconds; PostgreSQL's driver decodes JSON and times itself. The two executors run the same
SQL, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ledger.errors import LedgerError, UnknownRunError
from ledger.events import Event, Head, RunRecord
from ledger.store.codecs import (
    chained_prev_hash,
    decode_json,
    digest_hex,
    event_from_row,
    event_with_prev_hash,
    head_from_row,
    run_row_from,
)
from ledger.store.rows import Rows, sqlalchemy_rows

__all__ = ["READ_PAGE", "Reader", "Rows", "RunSummary", "VersionUse", "sqlalchemy_rows"]

READ_PAGE = 1_000


class VersionUse(NamedTuple):
    """One ``version_uses`` row: a batch that trained on ``samples`` samples of a version."""

    seq: int
    train_step: int
    samples: int


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


def _record(
    run_id: str, run_row: Any | None, head: Head | None, last_seq: int | None
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        created_at=None if run_row is None else run_row.created_at,
        config=None if run_row is None else run_row.config,
        head=head,
        last_event_seq=last_seq,
    )


# prev_hash is not stored: a page's rows chain to each other, and its first to the row before
# (read as the page's lead row); a single event selects it beside the row.
_EVENT_COLUMNS = ("e.run_id, e.seq, e.kind, e.version, e.cell_id, e.epoch, e.idempotency_key, "
                  "e.payload, e.hash, e.recorded_at, e.train_step")
_PREV_HASH = ("(SELECT p.hash FROM ledger_events p "
              "WHERE p.run_id = e.run_id AND p.seq = e.seq - 1)")
_WITH_PREV_HASH = f"SELECT {_EVENT_COLUMNS}, {_PREV_HASH} FROM ledger_events e "
_EVENT_PAGE = (f"SELECT {_EVENT_COLUMNS} FROM ledger_events e WHERE e.run_id = :run_id "
               "AND e.seq >= :first AND e.seq <= :last ORDER BY e.seq LIMIT :limit")
_AT_VERSION = _WITH_PREV_HASH + "WHERE e.run_id = :run_id AND e.version = :version"
# The kind a literal, not a bound parameter: SQLite uses the partial index on batch_trained
# rows only when the query's term matches the index's WHERE as written. Each subquery asks the
# index for one value: asked for the first row by seq, SQLite walked the run's primary key
# instead (O(run): 84 ms at 100k steps); asked for min and max in one query, it scanned the
# index (its min/max shortcut takes one aggregate a query).
_BATCH_AT_STEP = (_WITH_PREV_HASH + "WHERE e.run_id = :run_id AND e.seq = ("
                  "SELECT min(seq) FROM ledger_events WHERE run_id = :run_id "
                  "AND kind = 'batch_trained' AND train_step = :train_step)")
_STEP_BOUNDS = ("SELECT (SELECT min(train_step) FROM ledger_events "
                "WHERE run_id = :run_id AND kind = 'batch_trained'), "
                "(SELECT max(train_step) FROM ledger_events "
                "WHERE run_id = :run_id AND kind = 'batch_trained')")
_OF_KIND = (_WITH_PREV_HASH + "WHERE e.run_id = :run_id AND e.kind = :kind "
            "AND e.seq >= :first AND e.seq <= :last ORDER BY e.seq")
# The partial index over eval_finished rows (revision 0005; the literal kind again), as a join:
# the seqs from the covering index, then each row by its key. Asked for whole rows in one
# step, SQLite walks the primary key over the run's every event instead.
_EVALS = (f"SELECT {_EVENT_COLUMNS}, {_PREV_HASH} FROM ledger_events found "
          "JOIN ledger_events e ON e.run_id = found.run_id AND e.seq = found.seq "
          "WHERE found.run_id = :run_id AND found.kind = 'eval_finished' "
          "AND found.seq >= :first AND found.seq <= :last ORDER BY found.seq")
_HASH_AT = "SELECT hash FROM ledger_events WHERE run_id = :run_id AND seq = :seq"
_HEAD_COLUMNS = "head_version, epoch, publisher_cell, last_seq, head_hash"
_HEAD_ROW = f"SELECT {_HEAD_COLUMNS} FROM run_heads WHERE run_id = :run_id"
_ALL_HEADS = f"SELECT run_id, {_HEAD_COLUMNS} FROM run_heads"
_VERSION_USES = ("SELECT seq, train_step, samples FROM version_uses "
                 "WHERE run_id = :run_id AND version = :version ORDER BY seq")
_USES_FROM = ("SELECT seq, version, train_step, samples FROM version_uses "
              "WHERE run_id = :run_id AND seq >= :first")
# A join driven by the tail (a primary-key range), each key looked up in the unique index: as
# an IN (subquery), SQLite scans every event of the run instead.
_EARLIER_KEYS = ("SELECT earlier.idempotency_key, earlier.seq FROM ledger_events later "
                 "JOIN ledger_events earlier ON earlier.run_id = later.run_id "
                 "AND earlier.idempotency_key = later.idempotency_key "
                 "WHERE later.run_id = :run_id AND later.seq >= :first AND earlier.seq < :first")
_STATE_TABLES = ("projection_snapshots", "audit_checkpoints")
_RUN_ROWS = "SELECT run_id, created_at, config FROM runs"
_RUN_ROW = _RUN_ROWS + " WHERE run_id = :run_id"
_FIRST_RUN_ID = "SELECT min(run_id) FROM ledger_events"
_NEXT_RUN_ID = "SELECT min(run_id) FROM ledger_events WHERE run_id > :run_id"
_LAST_SEQ = "SELECT max(seq) FROM ledger_events WHERE run_id = :run_id"
_NEWEST_RUN = "SELECT run_id FROM runs ORDER BY created_at DESC, run_id DESC LIMIT 1"
_HAS_VERSION_TABLE = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'",
    # In the current schema, as SQLAlchemy's has_table looks (not anywhere on the search path).
    "postgresql": "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
                  "AND tablename = 'alembic_version')",
}
_NO_END = 2**62


class Reader:
    """Read queries bound to one connection (and so to the transaction it is in)."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows

    def _first(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        return next(iter(self.rows(sql, params)), None)

    def _scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        row = next(iter(self.rows(sql, params)), None)
        return None if row is None else row[0]

    def head_row(self, run_id: str) -> Head | None:
        """The run's ``run_heads`` row, or None."""
        with _decoding("corrupt head row in the ledger"):
            row = self._first(_HEAD_ROW, {"run_id": run_id})
            return None if row is None else head_from_row(row)

    def head(self, run_id: str) -> Head:
        """The run's head row.

        Raises:
            UnknownRunError: the run has no head row.
        """
        head = self.head_row(run_id)
        if head is None:
            raise UnknownRunError(run_id)
        return head

    def event_page(
        self, run_id: str, start_seq: int, end_seq: int | None, limit: int = READ_PAGE
    ) -> list[Event]:
        """Up to ``limit`` events with ``start_seq <= seq <= end_seq``, in seq order.

        Raises:
            LedgerError: a row that cannot be decoded (corrupt JSON or time).
        """
        lead = 1 if start_seq > 1 else 0  # the row before, for the first event's prev_hash
        rows = self.rows(_EVENT_PAGE, {
            "run_id": run_id, "first": start_seq - lead, "limit": limit + lead,
            "last": end_seq if end_seq is not None else _NO_END,
        })
        page: list[Event] = []
        before: tuple[int, str] | None = None  # (seq, hash) of the row read last
        with _decoding(f"run {run_id!r}: corrupt event row at or after seq {start_seq}"):
            for row in rows:
                seq, digest = row[1], digest_hex(row[8])
                hash_before = before[1] if before is not None and before[0] == seq - 1 else None
                if seq >= start_seq:
                    page.append(event_from_row(row, chained_prev_hash(seq, hash_before),
                                               digest))
                before = (seq, digest)
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
        row = self._first(_AT_VERSION, {"run_id": run_id, "version": version})
        with _decoding(f"run {run_id!r}: corrupt event row at version {version}"):
            return None if row is None else event_with_prev_hash(row)

    def event_hash_at(self, run_id: str, seq: int) -> str | None:
        """The stored hash of the event at ``seq`` (None: no such event); one PK lookup."""
        found = self._scalar(_HASH_AT, {"run_id": run_id, "seq": seq})
        return None if found is None else digest_hex(found)

    def batch_at_step(self, run_id: str, train_step: int) -> Event | None:
        """The first ``batch_trained`` event of ``train_step`` (index on kind and step)."""
        row = self._first(_BATCH_AT_STEP, {"run_id": run_id, "train_step": train_step})
        with _decoding(f"run {run_id!r}: corrupt batch_trained row of step {train_step}"):
            return None if row is None else event_with_prev_hash(row)

    def step_bounds(self, run_id: str) -> tuple[int | None, int | None]:
        """The lowest and highest train step a ``batch_trained`` records (index only)."""
        row = self._first(_STEP_BOUNDS, {"run_id": run_id})
        return (None, None) if row is None else (row[0], row[1])

    def version_uses(self, run_id: str, version: int) -> list[VersionUse]:
        """Every batch that trained on samples of ``version``, in seq order."""
        return [VersionUse(*row) for row in self.rows(
            _VERSION_USES, {"run_id": run_id, "version": version})]

    def version_uses_from(self, run_id: str, first_seq: int = 1) -> dict[int, dict[int, tuple]]:
        """seq -> {version: (train_step, samples)} of the run's ``version_uses`` rows with
        ``seq >= first_seq`` (what verify re-derives from the payloads; one range scan)."""
        found: dict[int, dict[int, tuple]] = {}
        for seq, version, train_step, samples in self.rows(_USES_FROM, {
                "run_id": run_id, "first": first_seq}):
            found.setdefault(seq, {})[version] = (train_step, samples)
        return found

    def events_of_kind(self, run_id: str, kind: str, first_seq: int, last_seq: int
                       ) -> list[Event]:
        """Events of one kind with ``first_seq <= seq <= last_seq`` (primary-key range)."""
        rows = self.rows(_OF_KIND, {"run_id": run_id, "kind": kind, "first": first_seq,
                                    "last": last_seq})
        with _decoding(f"run {run_id!r}: corrupt {kind} row in seq {first_seq}..{last_seq}"):
            return [event_with_prev_hash(row) for row in rows]

    def evals(self, run_id: str, last_seq: int) -> list[Event]:
        """The run's ``eval_finished`` events up to ``last_seq`` (their own index)."""
        rows = self.rows(_EVALS, {"run_id": run_id, "first": 1, "last": last_seq})
        with _decoding(f"run {run_id!r}: corrupt eval_finished row"):
            return [event_with_prev_hash(row) for row in rows]

    def earlier_keys(self, run_id: str, from_seq: int) -> dict[str, int]:
        """key -> seq of every event below ``from_seq`` whose idempotency key an event at or
        after ``from_seq`` holds too (none, unless the unique constraint was lost): one query,
        the later keys never leave the database."""
        return {key: seq for key, seq in self.rows(
            _EARLIER_KEYS, {"run_id": run_id, "first": from_seq})}

    def latest_snapshot(self, run_id: str, max_seq: int) -> tuple[int, str, Any] | None:
        """(seq, head_hash, state) of the newest read-model snapshot at or below ``max_seq``."""
        return self._latest("projection_snapshots", run_id, max_seq)

    def latest_audit_checkpoint(self, run_id: str, max_seq: int
                                ) -> tuple[int, str, Any] | None:
        """(seq, head_hash, state) of the newest audit checkpoint at or below ``max_seq``."""
        return self._latest("audit_checkpoints", run_id, max_seq)

    def stored_states(self, table: str, run_id: str) -> list[tuple[int, str, Any]]:
        """Every (seq, head_hash, state) of ``projection_snapshots`` or ``audit_checkpoints``
        for the run, in seq order (verify checks each)."""
        rows = self.rows(f"SELECT seq, head_hash, state FROM {_state_table(table)} "
                         "WHERE run_id = :run_id ORDER BY seq", {"run_id": run_id})
        with _decoding(f"run {run_id!r}: corrupt {table} row"):
            return [(seq, head_hash, decode_json(state)) for seq, head_hash, state in rows]

    def _latest(self, table: str, run_id: str, max_seq: int
                ) -> tuple[int, str, Any] | None:
        row = self._first(f"SELECT seq, head_hash, state FROM {_state_table(table)} "
                          "WHERE run_id = :run_id AND seq <= :max_seq ORDER BY seq DESC "
                          "LIMIT 1", {"run_id": run_id, "max_seq": max_seq})
        if row is None:
            return None
        try:
            return row[0], row[1], decode_json(row[2])
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
            run_rows = {row[0]: run_row_from(row) for row in self.rows(_RUN_ROWS)}
            heads = {row[0]: head_from_row(row[1:]) for row in self.rows(_ALL_HEADS)}
            last_seqs = self._last_seqs()
            return [
                _record(run_id, run_rows.get(run_id), heads.get(run_id), last_seqs.get(run_id))
                for run_id in sorted(run_rows.keys() | heads.keys() | last_seqs.keys())
            ]

    def _last_seqs(self) -> dict[str, int]:
        """Run id -> newest seq, for every run id the events hold: one index seek per run
        (the next run id, then its max seq), not a GROUP BY over every event."""
        found: dict[str, int] = {}
        run_id = self._scalar(_FIRST_RUN_ID)
        while run_id is not None:
            found[run_id] = self._scalar(_LAST_SEQ, {"run_id": run_id})
            run_id = self._scalar(_NEXT_RUN_ID, {"run_id": run_id})
        return found

    def run_record(self, run_id: str) -> RunRecord | None:
        """What the three tables hold for ``run_id`` (None: none of them knows it).

        Raises:
            LedgerError: a row that cannot be decoded.
        """
        with _decoding("corrupt row in the ledger"):
            found = self._first(_RUN_ROW, {"run_id": run_id})
            run_row = None if found is None else run_row_from(found)
            head = self.head_row(run_id)
            last_seq = self._scalar(_LAST_SEQ, {"run_id": run_id})
            if run_row is None and head is None and last_seq is None:
                return None
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
            return self._scalar(_NEWEST_RUN)

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database (None: no ledger schema)."""
        if not self._scalar(_HAS_VERSION_TABLE[self.rows.dialect]):
            return None
        return self._scalar("SELECT version_num FROM alembic_version")


def _state_table(table: str) -> str:
    if table not in _STATE_TABLES:
        raise ValueError(f"not a stored-state table: {table!r}")
    return table
