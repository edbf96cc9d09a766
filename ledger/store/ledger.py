"""The Ledger: the public facade over one database (many runs), SQLite or PostgreSQL
(``ledger.store.Ledger``).

Every write is one short transaction that locks the run's head row (:mod:`ledger.store.append`, where
the "why seq is gapless" argument lives), so appends to a run are totally ordered and
``seq``/``version`` come out gapless. Engines, pragmas and the translation of driver errors are
in :mod:`ledger.store.connection`; the read queries in :mod:`ledger.store.reads`; the audit in
:mod:`ledger.audit`, which reads through a snapshot and never imports this module.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa

from ledger import migrate
from ledger.store.append import append_locked, create_run_locked, lock_head
from ledger.store.connection import create_engine, normalise_url, run_with_retries, transaction
from ledger.errors import LedgerError, UnknownRunError
from ledger.events import Event, EventKind, Head
from ledger.store.reads import READ_PAGE, Reader, RunSummary, sqlalchemy_rows
from ledger.redact import redact_secrets, redact_url
from ledger.store.audits import AuditReads

__all__ = ["DEFAULT_SNAPSHOT_EVERY", "Ledger", "RunSummary"]

log = logging.getLogger("ledger.store")
# Every K train steps (a batch_trained whose step is a multiple of K) the ledger stores a
# read-model snapshot and, when the steps since the last audit checkpoint audit clean, a new
# checkpoint: readers and the end-of-run audit then fold at most K steps.
DEFAULT_SNAPSHOT_EVERY = 500

_T = TypeVar("_T")


class Ledger(AuditReads):
    """The durable, fenced weight-version ledger of one database (many runs).

    Open it with :meth:`open`. A writer creates or upgrades the schema; a reader
    (``readonly=True``) never creates a file or a table. Every write retries transient database
    failures with backoff for up to ``retry_seconds``; this is safe because every event carries
    an idempotency key (the caller's, or one generated per call), so a retried append whose
    first attempt did commit returns that first event instead of writing again. Reads after
    :meth:`open` (``head``, ``events``, ...) retry the same way: a run's readers (the rollout
    manager, the driver) must ride out a database restart just like its writers, and a read
    changes nothing, so retrying one is always safe. :meth:`open` itself does not retry, so a
    wrong URL fails at once.

    Safe to share between threads; each process should open its own.
    """

    def __init__(
        self, engine: sa.Engine, url: sa.URL, *, readonly: bool, retry_seconds: float,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> None:
        self._engine = engine
        self._url = url
        self.readonly = readonly
        self.retry_seconds = retry_seconds
        self.snapshot_every = snapshot_every

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, url: str, *, readonly: bool = False, retry_seconds: float = 60.0,
             snapshot_every: int = DEFAULT_SNAPSHOT_EVERY) -> Ledger:
        """Open the ledger at ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``).

        ``snapshot_every`` (K; 0: never): after appending the ``batch_trained`` of a step that
        is a multiple of K, a writer stores a read-model snapshot and an audit checkpoint
        (:meth:`checkpoint`).

        A writer creates the schema (or upgrades an old one) through Alembic, under the write
        lock, so several processes may open a fresh database at once. A reader checks that the
        schema is present and current and changes nothing.

        Raises:
            LedgerError: bad URL or unsupported backend; a reader's missing database.
            LedgerUnavailableError: the database cannot be reached.
            SchemaError: a reader found no schema or an old one; a writer found a newer one.
        """
        parsed = normalise_url(url)
        engine = create_engine(parsed, readonly)
        ledger = cls(engine, parsed, readonly=readonly, retry_seconds=retry_seconds,
                     snapshot_every=snapshot_every)
        try:
            migrate.ensure_schema(engine, parsed, readonly=readonly)
        except BaseException:
            engine.dispose()
            raise
        return ledger

    def close(self) -> None:
        """Release every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._url.get_backend_name()

    @property
    def url(self) -> str:
        """The database URL with its password (if any) replaced by ``***``: safe to print."""
        return redact_url(self._url)

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database."""
        with transaction(self._engine) as conn:
            return migrate.current_revision(conn)

    def upgrade_schema(self) -> str:
        """Upgrade the schema to the newest revision under the write lock; return it.

        Raises:
            SchemaError: the database is stamped with a revision this code does not know.
        """
        if self.readonly:
            raise LedgerError("a read-only ledger cannot upgrade its schema")
        return migrate.upgrade_schema(self._engine, self._url)

    # ------------------------------------------------------------------ transactions

    def _write(self):
        if self.readonly:
            raise LedgerError("this ledger was opened read-only")
        return transaction(self._engine, "write")

    def _with_retries(self, operation: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return run_with_retries(self.retry_seconds, operation, *args, **kwargs)

    @contextmanager
    def snapshot(self) -> Iterator[Reader]:
        """A :class:`~ledger.store.reads.Reader` on one read-only transaction: every read through it
        sees the same state, however many writers commit meanwhile. Not retried (a snapshot
        cannot be resumed); keep it short.

        Raises:
            LedgerUnavailableError: the database could not be reached.
        """
        with transaction(self._engine, "snapshot") as conn:
            yield Reader(sqlalchemy_rows(conn))

    # ------------------------------------------------------------------ writes

    def start_run(self, run_id: str, config: dict[str, Any] | None = None) -> Event:
        """Create ``run_id`` with its ``run_started`` event (version 0); idempotent per run.

        Starting a run that exists returns its ``run_started`` event and writes nothing, even if
        ``config`` differs (the first config is the run's). Concurrent starters see one winner.
        Credentials in the config (a database URL's password) are redacted before anything is
        stored: the config is hashed into the run's history, which can never be scrubbed.

        Raises:
            LedgerError: the config is not JSON-serialisable or the run id is empty.
        """
        if not run_id or not isinstance(run_id, str):
            raise LedgerError("run id must be a non-empty string")
        config = dict(config or {})
        try:
            config = redact_secrets(json.loads(json.dumps(config)))
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"run config is not JSON-serialisable: {exc}") from None
        return self._with_retries(self._start_run_once, run_id, config)

    def _start_run_once(self, run_id: str, config: dict[str, Any]) -> Event:
        try:
            with self._write() as conn:
                if lock_head(conn, run_id) is None:
                    return create_run_locked(conn, run_id, config)
        except LedgerError as exc:
            # A concurrent starter inserted the run first (PostgreSQL); fall through to read it.
            if "UNIQUE" not in str(exc).upper() and "duplicate key" not in str(exc):
                raise
        return next(self.events(run_id, 1, 1))

    def append(
        self,
        run_id: str,
        kind: str | EventKind,
        payload: dict[str, Any] | None = None,
        *,
        cell_id: str | None = None,
        epoch: int | None = None,
        idempotency_key: str | None = None,
    ) -> Event:
        """Append one event to ``run_id`` and return it as stored.

        Preconditions: publisher kinds (``weight_update_started/aborted``,
        ``weight_committed``, ``engines_stamped``, ``checkpoint_saved``) may come only from the
        cell named in the newest ``cell_promoted``, with that promotion's epoch.

        On failure nothing is written. A retry with the same ``idempotency_key`` is safe: if
        the first attempt committed, its stored event is returned unchanged. Concurrent
        appenders are serialised on the run's head row; each sees its own event at a distinct
        ``seq``.

        Raises:
            FencedError: a publisher event from a stale cell or epoch.
            UnknownRunError: the run was never started.
            IdempotencyConflictError: the key already names a different event.
            LedgerError: an unknown kind or a payload that does not fit it.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        from ledger.payloads import validate_payload  # the models, on the first write

        event_kind, clean_payload = validate_payload(kind, dict(payload or {}))
        key = idempotency_key or f"auto:{uuid.uuid4().hex}"
        stored = self._with_retries(
            self._append_once, run_id, event_kind, clean_payload, cell_id, epoch, key
        )
        step = clean_payload.get("train_step")
        if event_kind is EventKind.BATCH_TRAINED and self.snapshot_every > 0 \
                and isinstance(step, int) and step % self.snapshot_every == 0:
            try:
                self.checkpoint(run_id)
            except LedgerError:  # the event is committed; a later checkpoint catches up
                log.warning("could not store the snapshot of %s at step %s", run_id, step,
                            exc_info=True)
        return stored

    def _append_once(
        self,
        run_id: str,
        kind: EventKind,
        payload: dict[str, Any],
        cell_id: str | None,
        epoch: int | None,
        idempotency_key: str,
    ) -> Event:
        with self._write() as conn:
            head = lock_head(conn, run_id)
            if head is None:
                raise UnknownRunError(run_id)
            return append_locked(
                conn, head, run_id, kind, payload,
                cell_id=cell_id, epoch=epoch, idempotency_key=idempotency_key,
            )

    def promote(
        self,
        run_id: str,
        cell_id: str,
        reason: str = "start",
        *,
        previous_cell: str | None = None,
        node: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Make ``cell_id`` the publisher with a new epoch (previous + 1) and return it.

        ``node``: where the cell runs (``{"node_id", "host"}``), recorded in the event.
        Not fenced: the control plane decides promotions. From the moment this returns, the
        previous publisher's writes raise :class:`FencedError`.
        """
        payload = {"reason": reason, "previous_cell": previous_cell, **(node or {})}
        stored = self.append(
            run_id, EventKind.CELL_PROMOTED, payload,
            cell_id=cell_id, idempotency_key=idempotency_key,
        )
        assert stored.epoch is not None
        return stored.epoch

    def commit_weights(
        self,
        run_id: str,
        *,
        cell_id: str,
        epoch: int,
        train_step: int,
        transport: str = "full",
        adapter: str | None = None,
        checksum: str | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Commit a weight update and return its version: always ledger head + 1.

        Precondition: ``cell_id`` is the publisher and ``epoch`` its current epoch.
        Pass an ``idempotency_key`` (e.g. ``f"{cell}:{epoch}:{train_step}"``) to make a retry
        after an unknown outcome return the same version instead of committing twice.

        Raises:
            FencedError: ``cell_id``/``epoch`` is not the newest promotion; nothing written.
        """
        payload = {
            "train_step": train_step,
            "transport": transport,
            "adapter": adapter,
            "checksum": checksum,
        }
        stored = self.append(
            run_id, EventKind.WEIGHT_COMMITTED, payload,
            cell_id=cell_id, epoch=epoch, idempotency_key=idempotency_key,
        )
        assert stored.version is not None
        return stored.version

    # ------------------------------------------------------------------ reads

    def head(self, run_id: str) -> Head:
        """The run's head: newest committed version, epoch, publisher cell, last seq, hash.

        Raises:
            UnknownRunError: the run was never started.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        head = self._with_retries(self._head_row, run_id)
        if head is None:
            raise UnknownRunError(run_id)
        return head

    def _head_row(self, run_id: str) -> Head | None:
        with transaction(self._engine) as conn:
            return Reader(sqlalchemy_rows(conn)).head_row(run_id)

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterator[Event]:
        """Events of ``run_id`` with ``start_seq <= seq <= end_seq``, in seq order, paged.

        Each page is one read transaction, retried like any read. For reads that must agree
        with each other (a head and the events up to it), use :meth:`snapshot`.

        Raises:
            LedgerError: a row that cannot be decoded.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        next_seq = start_seq
        while end_seq is None or next_seq <= end_seq:
            page = self._with_retries(self._event_page, run_id, next_seq, end_seq)
            yield from page
            if len(page) < READ_PAGE:
                return
            next_seq = page[-1].seq + 1

    def _event_page(self, run_id: str, start_seq: int, end_seq: int | None) -> list[Event]:
        with transaction(self._engine) as conn:
            return Reader(sqlalchemy_rows(conn)).event_page(run_id, start_seq, end_seq, READ_PAGE)

    def event_at_version(self, run_id: str, version: int) -> Event | None:
        """The ``weight_committed`` event of ``version``, or None."""
        with transaction(self._engine) as conn:
            return Reader(sqlalchemy_rows(conn)).event_at_version(run_id, version)

    def runs(self) -> list[RunSummary]:
        """Every run, oldest first."""
        with transaction(self._engine) as conn:
            return Reader(sqlalchemy_rows(conn)).runs()
