"""rl-ledger's durable, fenced weight-version ledger.

A weight version is the position of a ``weight_committed`` event in an append-only ledger
(SQLite or PostgreSQL through SQLAlchemy), not a counter in a process. This package imports
SQLAlchemy and Alembic, never Ray or torch.
"""

from typing import TYPE_CHECKING, Any

# Names are imported on first use (PEP 562), so a command that needs only the store (``ledger
# status``) does not pay for the audit, payload models or plotting at start-up.
_EXPORTS = {
    "AuditReport": "ledger.audit", "Problem": "ledger.audit",
    "FencedError": "ledger.errors", "IdempotencyConflictError": "ledger.errors",
    "LedgerError": "ledger.errors", "LedgerUnavailableError": "ledger.errors",
    "SchemaError": "ledger.errors", "UnknownRunError": "ledger.errors",
    "Event": "ledger.events", "EventKind": "ledger.events", "Head": "ledger.events",
    "RunState": "ledger.projections", "fold": "ledger.projections",
    "redact_secrets": "ledger.redact", "redact_text": "ledger.redact",
    "redact_url": "ledger.redact", "url_without_password": "ledger.redact",
    "compact_ranges": "ledger.audit.report",
    "Ledger": "ledger.store", "RunSummary": "ledger.store",
    "Witness": "ledger.audit.witness", "check_witness": "ledger.audit.witness",
    "read_witnesses": "ledger.audit.witness",
}

if TYPE_CHECKING:
    from ledger.audit import AuditReport, Problem
    from ledger.audit.report import compact_ranges
    from ledger.audit.witness import Witness, check_witness, read_witnesses
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
    from ledger.store import Ledger, RunSummary


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
