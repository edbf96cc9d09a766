"""An index over eval_finished rows, so that ``ledger show V``, ``ledger lineage V`` and
``ledger evals`` find a run's scores without reading every event of the run.

A partial index on (run_id, kind, seq) where kind is eval_finished: a run holds a few such rows
among hundreds of thousands. Writes no row and changes none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_ledger_events_evals", "ledger_events", ["run_id", "kind", "seq"],
                    sqlite_where=sa.text("kind = 'eval_finished'"),
                    postgresql_where=sa.text("kind = 'eval_finished'"))


def downgrade() -> None:
    op.drop_index("ix_ledger_events_evals", "ledger_events")
