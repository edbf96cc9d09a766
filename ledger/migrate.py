"""Alembic through our own environment: revisions, and creating or upgrading a ledger's schema.

A writer creates the schema (or upgrades an old one) under the write lock, so several processes
may open a fresh database at once; a reader only checks that the schema is there and current.

Alembic is imported only to change a schema: a reader compares the stamped revision
(``alembic_version``, read with plain SQL) with :data:`SCHEMA_HEAD`, so ``ledger status``
does not pay Alembic's import. A test checks :data:`SCHEMA_HEAD` is the newest revision in
``migrations/``.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ledger.store.codecs import SCHEMA_HEAD
from ledger.store.connection import create_engine, normalise_url, transaction
from ledger.store.reads import Reader, sqlalchemy_rows
from ledger.errors import LedgerError, SchemaError
from ledger.redact import redact_url

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "SCHEMA_HEAD",
    "alembic_config",
    "current_revision",
    "ensure_schema",
    "head_revision",
    "schema_revision_at",
    "upgrade",
    "upgrade_schema",
]

_PG_MIGRATION_LOCK = 0x6C6564676572  # "ledger": serialises concurrent schema upgrades


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """An Alembic ``Config`` pointing at the packaged ``migrations`` directory."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("migrations")))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this code knows (:data:`SCHEMA_HEAD`)."""
    return SCHEMA_HEAD


def script_head_revision() -> str:
    """The newest revision in ``migrations/`` as Alembic reads it (what SCHEMA_HEAD must be)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations package has no revisions"
    return head


def current_revision(connection: sa.Connection) -> str | None:
    """The revision stamped in the database, or None if it has no ledger schema (the
    Reader's query, which the CLI's plain reads run too)."""
    return Reader(sqlalchemy_rows(connection)).schema_revision()


def upgrade(connection: sa.Connection, revision: str = "head") -> None:
    """Upgrade the schema inside the caller's transaction (which holds the write lock)."""
    from alembic import command

    command.upgrade(alembic_config(connection), revision)


def upgrade_schema(engine: sa.Engine, url: sa.URL, revision: str = "head") -> str:
    """Upgrade the schema at ``engine`` to ``revision`` in one write transaction; return the
    revision now stamped. On PostgreSQL an advisory lock serialises concurrent upgraders.

    Raises:
        SchemaError: the database is stamped with a revision this code does not know, or a
            revision refused the data it found (nothing changed).
        LedgerUnavailableError: the database could not be reached.
    """
    try:
        with transaction(engine, "write") as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            upgrade(conn, revision)
            return current_revision(conn) or ""
    except LedgerError:
        raise
    except Exception as exc:  # alembic: "Can't locate revision ..."
        if "revision" in str(exc):
            raise SchemaError(f"{redact_url(url)}: {exc}") from exc
        raise


def ensure_schema(engine: sa.Engine, url: sa.URL, *, readonly: bool) -> None:
    """A reader checks the schema is current; a writer creates or upgrades it.

    Raises:
        SchemaError: a reader found no schema or an old one; a writer found a newer one.
    """
    newest = head_revision()
    with transaction(engine) as conn:
        current = current_revision(conn)
    if current == newest:
        return
    if readonly:
        if current is None:
            raise SchemaError(
                f"{redact_url(url)} has no ledger schema (create it with `ledger db upgrade`)"
            )
        raise SchemaError(
            f"{redact_url(url)} has schema revision {current}, this code needs {newest} "
            "(run `ledger db upgrade`)"
        )
    upgrade_schema(engine, url)


def schema_revision_at(url: str) -> str | None:
    """The Alembic revision stamped in the database at ``url``; None if it has no ledger schema.

    Reads only and never creates a file or a table. Unlike ``Ledger.open(url, readonly=True)``
    it does not require the revision to be current, so it can answer for an old or unknown
    schema (``ledger db current``).

    Raises:
        LedgerError: bad URL or unsupported backend; no SQLite file at the path.
        LedgerUnavailableError: the database cannot be reached.
    """
    engine = create_engine(normalise_url(url), readonly=True)
    try:
        with transaction(engine) as conn:
            return current_revision(conn)
    finally:
        engine.dispose()
