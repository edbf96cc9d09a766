"""``ledger db current`` and ``ledger db upgrade``: the schema revision, read or moved to head.

Answers are JSON-ready dicts, like :mod:`ledger.cli.query`'s, with a header naming the database
(its URL with any password redacted), the backend, and the stamped and newest revisions.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ledger.errors import LedgerError, LedgerUnavailableError
from ledger.migrate import head_revision, schema_revision_at
from ledger.redact import redact_url
from ledger.store import Ledger

__all__ = ["db_current", "db_upgrade"]


def _revision_state(current: str | None, newest: str) -> str:
    if current is None:
        return "missing"
    return "current" if current == newest else "not current"


def db_current(url: str) -> dict[str, Any]:
    """The schema revision stamped in the database, next to the newest this code knows."""
    current = schema_revision_at(url)
    newest = head_revision()
    parsed = sa.make_url(url)
    return {
        "header": {
            "url": redact_url(parsed),
            "backend": parsed.get_backend_name(),
            "schema_revision": current,
            "schema_head": newest,
        },
        "revision": current,
        "head": newest,
        "state": _revision_state(current, newest),
    }


def db_upgrade(url: str) -> dict[str, Any]:
    """Create the database or upgrade its schema to the newest revision (the one writer here)."""
    try:
        before = schema_revision_at(url)
    except LedgerUnavailableError:
        raise
    except LedgerError:
        before = None  # no file yet: the writer below creates it (or re-raises a bad URL)
    with Ledger.open(url) as ledger:
        after = ledger.schema_revision()
        return {
            "header": {
                "url": ledger.url,
                "backend": ledger.backend,
                "schema_revision": after,
                "schema_head": head_revision(),
            },
            "from": before,
            "to": after,
            "changed": before != after,
        }
