"""Create the ledger tables: runs, ledger_events, run_heads.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
    )
    op.create_table(
        "ledger_events",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column(
            "seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True
        ),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=True),
        sa.Column("cell_id", sa.String(128), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("idempotency_key", sa.String(256), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("run_id", "idempotency_key", name="uq_ledger_events_idempotency"),
        sa.UniqueConstraint("run_id", "version", name="uq_ledger_events_version"),
    )
    op.create_table(
        "run_heads",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("head_version", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("publisher_cell", sa.String(128), nullable=True),
        sa.Column("head_hash", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_heads")
    op.drop_table("ledger_events")
    op.drop_table("runs")
