"""The Ledger: one SQL recorder for SQLite and PostgreSQL.

Every write is one short transaction that locks the run's head row, so appends to a run are
totally ordered and ``seq``/``version`` come out gapless. The two backends differ only in how
that lock is taken (``_write``): SQLite opens the transaction with ``BEGIN IMMEDIATE`` (the
database write lock, in WAL mode so readers are not blocked); PostgreSQL uses
``SELECT ... FOR UPDATE`` on the head row.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from ledger import migrate
from ledger.errors import (
    FencedError,
    IdempotencyConflictError,
    LedgerError,
    LedgerUnavailableError,
    SchemaError,
    UnknownRunError,
)
from ledger.events import (
    GENESIS_HASH,
    PUBLISHER_KINDS,
    Event,
    EventKind,
    Head,
    event_hash,
    validate_payload,
)
from ledger.schema import ledger_events, run_heads, runs

if TYPE_CHECKING:
    from ledger.audit import AuditReport

__all__ = ["Ledger", "RunSummary", "schema_revision_at"]

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_PAGE = 1_000
_PG_MIGRATION_LOCK = 0x6C6564676572  # "ledger": serialises concurrent schema upgrades


@dataclass(frozen=True)
class RunSummary:
    """A run as listed by :meth:`Ledger.runs`."""

    run_id: str
    created_at: datetime
    head_version: int
    epoch: int
    publisher_cell: str | None
    last_seq: int


def _utcnow() -> datetime:
    # Stored naive, in UTC: both backends round-trip it to the microsecond, which the hash needs.
    return datetime.now(UTC).replace(tzinfo=None)


def _normalise_url(url: str) -> sa.URL:
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise LedgerError(
            f"not a database URL: {url!r} (use sqlite:///PATH or postgresql+psycopg://...)"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise LedgerError(
            f"unsupported database {backend!r} in {url!r}: use sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    if backend == "postgresql" and parsed.get_driver_name() in ("psycopg2", ""):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise LedgerError("an in-memory SQLite database cannot hold a durable ledger")
    return parsed


def _create_engine(url: sa.URL, readonly: bool) -> sa.Engine:
    if url.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, pool_pre_ping=True)
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
            "sqlite://",
            creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False),
        )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            f"sqlite:///{path}", connect_args={"check_same_thread": False}
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


def schema_revision_at(url: str) -> str | None:
    """The Alembic revision stamped in the database at ``url``; None if it has no ledger schema.

    Reads only and never creates a file or a table. Unlike ``Ledger.open(url, readonly=True)``
    it does not require the revision to be current, so it can answer for an old or unknown
    schema (``ledger db current``).

    Raises:
        LedgerError: bad URL or unsupported backend; no SQLite file at the path.
        LedgerUnavailableError: the database cannot be reached.
    """
    engine = _create_engine(_normalise_url(url), readonly=True)
    try:
        with engine.connect() as conn, conn.begin():
            return migrate.current_revision(conn)
    except sa.exc.SQLAlchemyError as exc:
        raise _translate(exc) from exc
    finally:
        engine.dispose()


def _translate(exc: Exception) -> LedgerError:
    """Map a driver error to the ledger's own; the one place this happens."""
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return LedgerUnavailableError(f"database unavailable: {detail}")
    if isinstance(exc, sa.exc.DBAPIError):
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return LedgerError(f"database error: {detail}")
    return LedgerError(f"database error: {exc}")


def _row_to_event(row: sa.Row) -> Event:
    return Event(
        run_id=row.run_id,
        seq=row.seq,
        kind=row.kind,
        payload=row.payload if isinstance(row.payload, dict) else json.loads(row.payload),
        recorded_at=row.recorded_at,
        prev_hash=row.prev_hash,
        hash=row.hash,
        version=row.version,
        cell_id=row.cell_id,
        epoch=row.epoch,
        idempotency_key=row.idempotency_key,
    )


class Ledger:
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
        self, engine: sa.Engine, url: sa.URL, *, readonly: bool, retry_seconds: float
    ) -> None:
        self._engine = engine
        self._url = url
        self.readonly = readonly
        self.retry_seconds = retry_seconds

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, url: str, *, readonly: bool = False, retry_seconds: float = 60.0) -> Ledger:
        """Open the ledger at ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``).

        A writer creates the schema (or upgrades an old one) through Alembic, under the write
        lock, so several processes may open a fresh database at once. A reader checks that the
        schema is present and current and changes nothing.

        Raises:
            LedgerError: bad URL or unsupported backend; a reader's missing database.
            LedgerUnavailableError: the database cannot be reached.
            SchemaError: a reader found no schema or an old one; a writer found a newer one.
        """
        parsed = _normalise_url(url)
        engine = _create_engine(parsed, readonly)
        ledger = cls(engine, parsed, readonly=readonly, retry_seconds=retry_seconds)
        try:
            ledger._prepare_schema()
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
        """The database URL, password hidden."""
        return self._url.render_as_string(hide_password=True)

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database."""
        with self._read() as conn:
            return migrate.current_revision(conn)

    def _prepare_schema(self) -> None:
        head = migrate.head_revision()
        with self._read() as conn:
            current = migrate.current_revision(conn)
        if current == head:
            return
        if self.readonly:
            if current is None:
                raise SchemaError(
                    f"{self.url} has no ledger schema (create it with `ledger db upgrade`)"
                )
            raise SchemaError(
                f"{self.url} has schema revision {current}, this code needs {head} "
                "(run `ledger db upgrade`)"
            )
        self.upgrade_schema()

    def upgrade_schema(self) -> str:
        """Upgrade the schema to the newest revision under the write lock; return it.

        Raises:
            SchemaError: the database is stamped with a revision this code does not know.
        """
        if self.readonly:
            raise LedgerError("a read-only ledger cannot upgrade its schema")
        try:
            with self._write() as conn:
                if self.backend == "postgresql":
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
                migrate.upgrade(conn)
        except LedgerError:
            raise
        except Exception as exc:  # alembic: "Can't locate revision ..."
            if "revision" in str(exc):
                raise SchemaError(f"{self.url}: {exc}") from exc
            raise
        return migrate.head_revision()

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        try:
            with self._engine.connect() as conn, conn.begin():
                yield conn
        except LedgerError:
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc) from exc

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        if self.readonly:
            raise LedgerError("this ledger was opened read-only")
        try:
            with self._engine.connect() as raw:
                conn = raw.execution_options(ledger_write=True)
                with conn.begin():
                    yield conn
        except LedgerError:
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise _translate(exc) from exc

    def _with_retries(self, operation, *args, **kwargs):
        """Run one transaction (a write or a read), retrying only
        :class:`LedgerUnavailableError` with backoff for ``retry_seconds``."""
        retrying = Retrying(
            retry=retry_if_exception_type(LedgerUnavailableError),
            wait=wait_exponential_jitter(initial=0.05, max=2.0),
            stop=stop_after_delay(self.retry_seconds),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "ledger %s failed (%s); retrying",
                getattr(operation, "__name__", "operation").lstrip("_"),
                state.outcome.exception(),
            ),
        )
        try:
            return retrying(operation, *args, **kwargs)
        except RetryError as exc:  # pragma: no cover - reraise=True re-raises the last error
            raise exc.last_attempt.exception() from exc

    # ------------------------------------------------------------------ writes

    def start_run(self, run_id: str, config: dict[str, Any] | None = None) -> Event:
        """Create ``run_id`` with its ``run_started`` event (version 0); idempotent per run.

        Starting a run that exists returns its ``run_started`` event and writes nothing, even if
        ``config`` differs (the first config is the run's). Concurrent starters see one winner.

        Raises:
            LedgerError: the config is not JSON-serialisable or the run id is empty.
        """
        if not run_id or not isinstance(run_id, str):
            raise LedgerError("run id must be a non-empty string")
        config = dict(config or {})
        try:
            config = json.loads(json.dumps(config))
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"run config is not JSON-serialisable: {exc}") from None
        return self._with_retries(self._start_run_once, run_id, config)

    def _start_run_once(self, run_id: str, config: dict[str, Any]) -> Event:
        try:
            with self._write() as conn:
                if self._lock_head(conn, run_id) is None:
                    conn.execute(
                        runs.insert().values(run_id=run_id, created_at=_utcnow(), config=config)
                    )
                    conn.execute(
                        run_heads.insert().values(
                            run_id=run_id,
                            last_seq=0,
                            head_version=0,
                            epoch=0,
                            publisher_cell=None,
                            head_hash=GENESIS_HASH,
                        )
                    )
                    head = self._lock_head(conn, run_id)
                    return self._append_locked(
                        conn, head, run_id, EventKind.RUN_STARTED, {"config": config},
                        cell_id=None, epoch=None, idempotency_key=f"run_started:{run_id}",
                    )
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
        event_kind, clean_payload = validate_payload(kind, dict(payload or {}))
        key = idempotency_key or f"auto:{uuid.uuid4().hex}"
        return self._with_retries(
            self._append_once, run_id, event_kind, clean_payload, cell_id, epoch, key
        )

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
            head = self._lock_head(conn, run_id)
            if head is None:
                raise UnknownRunError(run_id)
            return self._append_locked(
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
        idempotency_key: str | None = None,
    ) -> int:
        """Make ``cell_id`` the publisher with a new epoch (previous + 1) and return it.

        Not fenced: the control plane decides promotions. From the moment this returns, the
        previous publisher's writes raise :class:`FencedError`.
        """
        payload = {"reason": reason, "previous_cell": previous_cell}
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

    def _lock_head(self, conn: sa.Connection, run_id: str) -> Head | None:
        # Why seq and version are gapless and in commit order: every append of a run first
        # takes this row's lock (FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already
        # holds the database write lock), reads last_seq/head_version, writes +1 and updates
        # this row in the same transaction. A second appender blocks here until the first
        # commits or rolls back, so no two transactions can read the same last_seq, and a
        # rolled-back append leaves no hole: the numbers are taken only by what commits.
        query = sa.select(run_heads).where(run_heads.c.run_id == run_id)
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).first()
        if row is None:
            return None
        return Head(
            version=row.head_version,
            epoch=row.epoch,
            publisher_cell=row.publisher_cell,
            seq=row.last_seq,
            hash=row.head_hash,
        )

    def _append_locked(
        self,
        conn: sa.Connection,
        head: Head,
        run_id: str,
        kind: EventKind,
        payload: dict[str, Any],
        *,
        cell_id: str | None,
        epoch: int | None,
        idempotency_key: str,
    ) -> Event:
        existing = conn.execute(
            sa.select(ledger_events).where(
                ledger_events.c.run_id == run_id,
                ledger_events.c.idempotency_key == idempotency_key,
            )
        ).first()
        if existing is not None:
            stored = _row_to_event(existing)
            if stored.kind != kind.value or stored.cell_id != cell_id:
                raise IdempotencyConflictError(
                    f"run {run_id!r}: idempotency key {idempotency_key!r} already names "
                    f"{stored.kind} at seq {stored.seq}"
                )
            return stored

        version: int | None = None
        new_head = head
        if kind in PUBLISHER_KINDS:
            if head.epoch == 0 or cell_id != head.publisher_cell or epoch != head.epoch:
                raise FencedError(run_id, cell_id, epoch, head.publisher_cell, head.epoch)
        if kind is EventKind.CELL_PROMOTED:
            if not cell_id:
                raise LedgerError("cell_promoted needs a cell_id")
            if epoch is not None and epoch != head.epoch + 1:
                raise LedgerError(
                    f"cell_promoted must carry epoch {head.epoch + 1}, not {epoch}"
                )
            epoch = head.epoch + 1
            new_head = Head(head.version, epoch, cell_id, head.seq, head.hash)
        elif kind is EventKind.CELL_STATE and not cell_id:
            raise LedgerError("cell_state needs a cell_id")
        elif kind is EventKind.WEIGHT_COMMITTED:
            version = head.version + 1
            new_head = Head(version, head.epoch, head.publisher_cell, head.seq, head.hash)
        elif kind is EventKind.ENGINES_STAMPED and payload["version"] > head.version:
            raise LedgerError(
                f"cannot stamp engines with version {payload['version']}: "
                f"head is {head.version}"
            )

        seq = head.seq + 1
        recorded_at = _utcnow()
        digest = event_hash(
            prev_hash=head.hash, run_id=run_id, seq=seq, kind=kind.value, version=version,
            cell_id=cell_id, epoch=epoch, idempotency_key=idempotency_key, payload=payload,
            recorded_at=recorded_at,
        )
        stored = Event(
            run_id=run_id, seq=seq, kind=kind.value, payload=payload, recorded_at=recorded_at,
            prev_hash=head.hash, hash=digest, version=version, cell_id=cell_id, epoch=epoch,
            idempotency_key=idempotency_key,
        )
        conn.execute(
            ledger_events.insert().values(
                run_id=run_id, seq=seq, kind=kind.value, version=version, cell_id=cell_id,
                epoch=epoch, idempotency_key=idempotency_key, payload=payload,
                prev_hash=head.hash, hash=digest, recorded_at=recorded_at,
            )
        )
        conn.execute(
            run_heads.update()
            .where(run_heads.c.run_id == run_id)
            .values(
                last_seq=seq,
                head_version=new_head.version,
                epoch=new_head.epoch,
                publisher_cell=new_head.publisher_cell,
                head_hash=digest,
            )
        )
        return stored

    # ------------------------------------------------------------------ reads

    def head(self, run_id: str) -> Head:
        """The run's head: newest committed version, epoch, publisher cell, last seq, hash.

        Raises:
            UnknownRunError: the run was never started.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        row = self._with_retries(self._head_row, run_id)
        if row is None:
            raise UnknownRunError(run_id)
        return Head(row.head_version, row.epoch, row.publisher_cell, row.last_seq, row.head_hash)

    def _head_row(self, run_id: str) -> sa.Row | None:
        with self._read() as conn:
            return conn.execute(
                sa.select(run_heads).where(run_heads.c.run_id == run_id)
            ).first()

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterator[Event]:
        """Events of ``run_id`` with ``start_seq <= seq <= end_seq``, in seq order, paged.

        Each page is one read transaction, retried like any read.

        Raises:
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        next_seq = start_seq
        while end_seq is None or next_seq <= end_seq:
            query = (
                sa.select(ledger_events)
                .where(ledger_events.c.run_id == run_id, ledger_events.c.seq >= next_seq)
                .order_by(ledger_events.c.seq)
                .limit(_READ_PAGE)
            )
            if end_seq is not None:
                query = query.where(ledger_events.c.seq <= end_seq)
            page = self._with_retries(self._event_page, run_id, query, next_seq)
            yield from page
            if len(page) < _READ_PAGE:
                return
            next_seq = page[-1].seq + 1

    def _event_page(self, run_id: str, query: sa.Select, next_seq: int) -> list[Event]:
        with self._read() as conn:
            try:
                return [_row_to_event(row) for row in conn.execute(query)]
            except (ValueError, TypeError) as exc:
                raise LedgerError(
                    f"run {run_id!r}: corrupt event row at or after seq {next_seq}: {exc}"
                ) from exc

    def event_at_version(self, run_id: str, version: int) -> Event | None:
        """The ``weight_committed`` event of ``version``, or None."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(ledger_events).where(
                    ledger_events.c.run_id == run_id, ledger_events.c.version == version
                )
            ).first()
        return None if row is None else _row_to_event(row)

    def runs(self) -> list[RunSummary]:
        """Every run, oldest first."""
        query = (
            sa.select(runs.c.run_id, runs.c.created_at, run_heads)
            .join(run_heads, run_heads.c.run_id == runs.c.run_id)
            .order_by(runs.c.created_at, runs.c.run_id)
        )
        with self._read() as conn:
            return [
                RunSummary(
                    run_id=row.run_id,
                    created_at=row.created_at,
                    head_version=row.head_version,
                    epoch=row.epoch,
                    publisher_cell=row.publisher_cell,
                    last_seq=row.last_seq,
                )
                for row in conn.execute(query)
            ]

    def run_config(self, run_id: str) -> dict[str, Any]:
        """The config the run was started with."""
        with self._read() as conn:
            row = conn.execute(sa.select(runs.c.config).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise UnknownRunError(run_id)
        return row.config

    def verify(self, run_id: str | None = None) -> AuditReport:
        """Check every invariant the ledger can see (DESIGN section 4), for one run or all."""
        from ledger.audit import verify

        return verify(self, run_id)
