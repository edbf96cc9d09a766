"""The ledger's tables. Alembic migrations create them; this metadata is what they must equal.

``seq`` and ``version`` are plain integers assigned under the head-row lock (see
``ledger.store.append.lock_head``), never sequences or autoincrement: those leave gaps on rollback
and can become visible out of commit order.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "audit_checkpoints",
    "ledger_events",
    "metadata",
    "projection_snapshots",
    "run_heads",
    "runs",
    "version_uses",
]

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.DateTime(), nullable=False),
    sa.Column("config", sa.JSON(), nullable=False),
)

ledger_events = sa.Table(
    "ledger_events",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False),
    # Set on weight_committed rows only: NULLs never collide, so the unique constraint below
    # is exactly "one commit per version per run" on both backends.
    sa.Column("version", sa.BigInteger(), nullable=True),
    sa.Column("cell_id", sa.String(128), nullable=True),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
    # NOT NULL since revision 0002: a NULL never collides in the unique constraint below, so a
    # keyless event could be written twice by a retry.
    sa.Column("idempotency_key", sa.String(256), nullable=False),
    sa.Column("payload", sa.JSON(), nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Column("recorded_at", sa.DateTime(), nullable=False),
    # Since revision 0003: the payload's train_step, copied out so that "the batch_trained of
    # step N" is one indexed lookup. Outside the hash (derived); verify checks it equals the
    # payload's.
    sa.Column("train_step", sa.BigInteger(), nullable=True),
    sa.UniqueConstraint("run_id", "idempotency_key", name="uq_ledger_events_idempotency"),
    sa.UniqueConstraint("run_id", "version", name="uq_ledger_events_version"),
    # Partial: only batch_trained rows are looked up by step (a quarter of the rows).
    sa.Index("ix_ledger_events_kind_step", "run_id", "kind", "train_step",
             sqlite_where=sa.text("kind = 'batch_trained'"),
             postgresql_where=sa.text("kind = 'batch_trained'")),
)

# Derived rows (revision 0003), written in the append's transaction and re-derived by verify:
# which steps trained on samples of which version (a batch_trained's sample_versions), so
# `ledger lineage V` is an indexed lookup.
version_uses = sa.Table(
    "version_uses",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("version", sa.BigInteger(), primary_key=True),
    sa.Column("seq", sa.BigInteger(), primary_key=True),
    sa.Column("train_step", sa.BigInteger(), nullable=False),
    sa.Column("samples", sa.BigInteger(), nullable=False),
)

# Read-model snapshots (revision 0003): the run's progress (ledger.progress) folded up to seq,
# trusted only while head_hash is the chain's hash at seq; readers fold only the tail.
projection_snapshots = sa.Table(
    "projection_snapshots",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("seq", sa.BigInteger(), primary_key=True),
    sa.Column("head_hash", sa.String(64), nullable=False),
    sa.Column("state", sa.JSON(), nullable=False),
    sa.Column("recorded_at", sa.DateTime(), nullable=False),
)

# Audit checkpoints (revision 0003): the audit's state after it verified a run up to seq,
# so `verify --since-verified` checks only the events after it (head_hash re-checked).
audit_checkpoints = sa.Table(
    "audit_checkpoints",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("seq", sa.BigInteger(), primary_key=True),
    sa.Column("head_hash", sa.String(64), nullable=False),
    sa.Column("state", sa.JSON(), nullable=False),
    sa.Column("recorded_at", sa.DateTime(), nullable=False),
)

run_heads = sa.Table(
    "run_heads",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("last_seq", sa.BigInteger(), nullable=False),
    sa.Column("head_version", sa.BigInteger(), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("publisher_cell", sa.String(128), nullable=True),
    sa.Column("head_hash", sa.String(64), nullable=False),
)
