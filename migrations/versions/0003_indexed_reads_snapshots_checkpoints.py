"""Reads that do not fold the whole run: a train_step column and index, version_uses,
projection_snapshots and audit_checkpoints.

Rewrites no hashed data: ``train_step`` and ``version_uses`` are derived from the payloads
already stored (filled in here for old rows), and the two new tables start empty (a reader
without a snapshot folds from event 1, as before). Old ``batch_trained`` payloads keep their
flat prompt-id lists; readers accept both that and the range form.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_STEP_KINDS = ("batch_trained", "weight_update_started", "weight_update_aborted",
               "weight_committed", "checkpoint_saved")


def _state_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
    )


def upgrade() -> None:
    with op.batch_alter_table("ledger_events") as batch:
        batch.add_column(sa.Column("train_step", sa.BigInteger(), nullable=True))
    op.create_index("ix_ledger_events_kind_step", "ledger_events",
                    ["run_id", "kind", "train_step"],
                    sqlite_where=sa.text("kind = 'batch_trained'"),
                    postgresql_where=sa.text("kind = 'batch_trained'"))
    op.create_table(
        "version_uses",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("version", sa.BigInteger(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("train_step", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
    )
    _state_table("projection_snapshots")
    _state_table("audit_checkpoints")
    _backfill(op.get_bind())


def _backfill(conn: sa.Connection) -> None:
    events = sa.table("ledger_events", sa.column("run_id"), sa.column("seq"),
                      sa.column("kind"), sa.column("payload"), sa.column("train_step"))
    uses = sa.table("version_uses", sa.column("run_id"), sa.column("version"),
                    sa.column("seq"), sa.column("train_step"), sa.column("samples"))
    rows = conn.execute(sa.select(events.c.run_id, events.c.seq, events.c.kind,
                                  events.c.payload).where(events.c.kind.in_(_STEP_KINDS)))
    steps, derived = [], []
    for row in rows:
        payload = json.loads(row.payload) if isinstance(row.payload, str) else row.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("train_step"), int):
            continue  # a malformed row: verify names it
        steps.append({"r": row.run_id, "s": row.seq, "step": payload["train_step"]})
        versions = payload.get("sample_versions")
        if row.kind == "batch_trained" and isinstance(versions, dict):
            derived += [{"run_id": row.run_id, "version": int(version), "seq": row.seq,
                         "train_step": payload["train_step"], "samples": int(count)}
                        for version, count in versions.items()]
    if steps:
        conn.execute(events.update()
                     .where(events.c.run_id == sa.bindparam("r"), events.c.seq == sa.bindparam("s"))
                     .values(train_step=sa.bindparam("step")), steps)
    if derived:
        conn.execute(uses.insert(), derived)


def downgrade() -> None:
    op.drop_table("audit_checkpoints")
    op.drop_table("projection_snapshots")
    op.drop_table("version_uses")
    op.drop_index("ix_ledger_events_kind_step", "ledger_events")
    with op.batch_alter_table("ledger_events") as batch:
        batch.drop_column("train_step")
