"""rl-ledger's durable, fenced weight-version ledger.

A weight version is the position of a ``weight_committed`` event in an append-only ledger
(SQLite or PostgreSQL through SQLAlchemy), not a counter in a process. This package imports
SQLAlchemy and Alembic, never Ray or torch.
"""

from ledger.audit import AuditReport, Problem
from ledger.errors import (
    FencedError,
    IdempotencyConflictError,
    LedgerError,
    LedgerUnavailableError,
    SchemaError,
    UnknownRunError,
)
from ledger.events import Event, EventKind, Head
from ledger.projections import RunState, fold
from ledger.redact import redact_secrets, redact_text, redact_url, url_without_password
from ledger.audit.report import compact_ranges
from ledger.store import Ledger, RunSummary
from ledger.audit.witness import Witness, check_witness, read_witnesses

__all__ = [
    "AuditReport",
    "Event",
    "EventKind",
    "FencedError",
    "Head",
    "IdempotencyConflictError",
    "Ledger",
    "LedgerError",
    "LedgerUnavailableError",
    "Problem",
    "RunState",
    "RunSummary",
    "SchemaError",
    "UnknownRunError",
    "Witness",
    "check_witness",
    "compact_ranges",
    "fold",
    "read_witnesses",
    "redact_secrets",
    "redact_text",
    "redact_url",
    "url_without_password",
]
