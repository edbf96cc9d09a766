"""An index over version_uses by (run_id, seq), so that the incremental audit (``ledger verify
--since-verified``, and the job's own end-of-run audit) reads the derived rows of its tail only.

The table's key is (run_id, version, seq), for ``ledger lineage V``; asked for the rows from a
seq on, both backends read every row of the run (20 ms at 100k steps on SQLite, growing with
the run). Writes no row and changes none.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_version_uses_seq", "version_uses", ["run_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_version_uses_seq", "version_uses")
