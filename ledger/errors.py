"""Errors raised by the ledger.

::

    LedgerError                   anything the ledger refuses or cannot do
    ├── FencedError               a publisher write from a cell/epoch that is not the newest
    ├── UnknownRunError           a run id the ledger has never started
    ├── SchemaError               no ledger schema, or one older/newer than this code
    ├── LedgerUnavailableError    the database cannot be reached (transient; writes retry)
    ├── IdempotencyConflictError  a key reused with other parameters (kind, cell, epoch, ...)
    ├── PayloadError              a stored payload read through a model it does not fit
    └── QueryError                a ``ledger`` command argument it cannot answer (exit code 2)

Driver errors (SQLAlchemy, sqlite3, psycopg) are translated into :class:`LedgerError` in one
place, the exit of :func:`ledger.store.connection.transaction`, with credentials redacted. Every class pickles with its arguments, so errors raised
inside a Ray actor arrive intact in the caller.
"""

from __future__ import annotations

__all__ = [
    "FencedError",
    "IdempotencyConflictError",
    "LedgerError",
    "LedgerUnavailableError",
    "PayloadError",
    "QueryError",
    "SchemaError",
    "UnknownRunError",
    "driver_error",
]


class LedgerError(Exception):
    """The ledger refused an operation or could not reach its database."""


class FencedError(LedgerError):
    """A publisher event from a cell or epoch that is no longer the newest promotion.

    Nothing was written. The caller is a zombie (or lost a race) and must stop publishing.
    """

    def __init__(
        self,
        run_id: str,
        cell_id: str | None,
        epoch: int | None,
        current_cell: str | None,
        current_epoch: int,
    ) -> None:
        self.run_id = run_id
        self.cell_id = cell_id
        self.epoch = epoch
        self.current_cell = current_cell
        self.current_epoch = current_epoch
        super().__init__(
            f"run {run_id!r}: write from cell {cell_id!r} epoch {epoch} is fenced; "
            f"publisher is cell {current_cell!r} epoch {current_epoch}"
        )

    def __reduce__(self):
        return (
            type(self),
            (self.run_id, self.cell_id, self.epoch, self.current_cell, self.current_epoch),
        )


class UnknownRunError(LedgerError):
    """The run id has no ``run_started`` event in this ledger."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}")

    def __reduce__(self):
        return (type(self), (self.run_id,))


class SchemaError(LedgerError):
    """The database has no ledger schema, or one this code cannot use without an upgrade."""


class LedgerUnavailableError(LedgerError):
    """The database could not be reached or was locked past the busy timeout."""


class IdempotencyConflictError(LedgerError):
    """An idempotency key already names an event with other parameters (kind, cell, epoch,
    train step, transport, adapter, checksum or version); nothing was written. A retry must
    repeat the call exactly; a new event needs a new key."""


class PayloadError(LedgerError):
    """A stored event's payload does not fit the model it was read through
    (:meth:`ledger.events.Event.payload_as`): a field is missing or of the wrong type. The
    append validates every payload, so this means a row written around it; ``ledger verify``
    names the row (``payload_invalid``)."""

    def __init__(self, run_id: str, seq: int, kind: str, detail: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.kind = kind
        self.detail = detail
        super().__init__(f"run {run_id!r} seq {seq}: {kind} payload: {detail}")

    def __reduce__(self):
        return (type(self), (self.run_id, self.seq, self.kind, self.detail))


class QueryError(LedgerError):
    """A command-line argument the ledger cannot answer: bad range, time, kind, version, run
    (raised by :mod:`ledger.cli.args` and the queries; the command prints it in one line)."""


def driver_error(exc: BaseException, *, unavailable: bool) -> LedgerError:
    """The ledger's own error for a database driver's: the driver's first line, with any
    credential redacted (a driver may echo its connection string); ``unavailable`` (the
    driver's OperationalError or InterfaceError) makes it a :class:`LedgerUnavailableError`.
    """
    from ledger.redact import redact_text

    lines = str(exc).strip().splitlines()
    detail = redact_text(lines[0] if lines else type(exc).__name__)
    if unavailable:
        return LedgerUnavailableError(f"database unavailable: {detail}")
    return LedgerError(f"database error: {detail}")
