"""Alembic through our own environment: build the config in code, upgrade, read revisions."""

from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

__all__ = ["alembic_config", "current_revision", "head_revision", "upgrade"]


def alembic_config(connection: sa.Connection | None = None, url: str | None = None) -> Config:
    """An Alembic ``Config`` pointing at the packaged ``migrations`` directory."""
    config = Config()
    config.set_main_option("script_location", str(resources.files("migrations")))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations package has no revisions"
    return head


def current_revision(connection: sa.Connection) -> str | None:
    """The revision stamped in the database, or None if it has no ledger schema."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(connection: sa.Connection, revision: str = "head") -> None:
    """Upgrade the schema inside the caller's transaction (which holds the write lock)."""
    command.upgrade(alembic_config(connection), revision)
