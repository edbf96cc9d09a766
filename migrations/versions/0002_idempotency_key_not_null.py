"""Every event has an idempotency key: ledger_events.idempotency_key becomes NOT NULL.

A NULL key never collides in UNIQUE (run_id, idempotency_key), so a keyless event could be
written twice by a retry. The ledger has always generated a key when the caller gave none, so a
NULL can only come from a write behind the ledger's back. The key is hashed into the event, so
it cannot be filled in afterwards without breaking the chain: this revision refuses to run,
naming the first such events, and changes nothing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.errors import SchemaError

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    keyless = op.get_bind().execute(
        sa.text(
            "SELECT run_id, seq FROM ledger_events WHERE idempotency_key IS NULL "
            "ORDER BY run_id, seq LIMIT 5"
        )
    ).all()
    if keyless:
        where = ", ".join(f"run {row.run_id} seq {row.seq}" for row in keyless)
        raise SchemaError(
            f"cannot upgrade to revision 0002: events without an idempotency key ({where}); "
            "they were written outside the ledger and the key is part of their hash, so it "
            "cannot be filled in. Keep this database at 0001 and investigate"
        )
    with op.batch_alter_table("ledger_events") as batch:
        batch.alter_column(
            "idempotency_key", existing_type=sa.String(256), nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_events") as batch:
        batch.alter_column("idempotency_key", existing_type=sa.String(256), nullable=True)
