"""Alembic environment for the ledger, usable without an ``alembic.ini`` on disk.

``ledger.migrate`` builds the Alembic ``Config`` in code and hands over an open connection in
``config.attributes["connection"]``; the caller holds the write lock on it, so concurrent
writers opening one database never race to create the tables. Offline (``--sql``) mode renders
the DDL for the URL in ``sqlalchemy.url``.
"""

from __future__ import annotations

from alembic import context

from ledger.schema import metadata

config = context.config


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("ledger migrations need a connection from ledger.migrate")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    # The connection is already inside the caller's transaction: this nests, it does not commit.
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
