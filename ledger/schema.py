"""The ledger's tables, and how an event's hash and time are stored. Alembic migrations create
them; this metadata is what they must equal.

``seq`` and ``version`` are plain integers assigned under the head-row lock (see
``ledger.store.append.lock_head``), never sequences or autoincrement: those leave gaps on rollback
and can become visible out of commit order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ledger.store.codecs import digest_hex, micros_since_epoch, time_from_stored

__all__ = [
    "Digest",
    "UtcTimestamp",
    "audit_checkpoints",
    "digest_hex",
    "ledger_events",
    "metadata",
    "micros_since_epoch",
    "projection_snapshots",
    "run_heads",
    "runs",
    "time_from_stored",
    "version_uses",
]

# How an event's hash and time are stored: see ledger.store.codecs (no SQLAlchemy there, so the
# CLI's plain-driver reads decode rows without importing it).


class Digest(sa.types.TypeDecorator):
    """A sha256 digest: hex text in Python, 32 raw bytes in the database."""

    impl = sa.LargeBinary(32)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> bytes | None:
        return None if value is None else bytes.fromhex(value)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> str | None:
        return None if value is None else digest_hex(value)


class UtcTimestamp(sa.types.TypeDecorator):
    """A naive UTC datetime: integer microseconds since the epoch on SQLite, a native
    timestamp on other backends."""

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.BigInteger())
        return dialect.type_descriptor(sa.DateTime())

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> Any:
        if value is None or dialect.name != "sqlite":
            return value
        return micros_since_epoch(value)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        return None if value is None else time_from_stored(value)


metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.DateTime(), nullable=False),
    sa.Column("config", sa.JSON(), nullable=False),
)

# Since revision 0004 the table is compact (issue 22): no stored prev_hash (it is the hash of
# the row before, which readers join in), the hash as 32 raw bytes, the time as 8 bytes, the
# one-commit-per-version rule as a partial index over commits only, and on SQLite no rowid (the
# primary key is the table's own B-tree instead of a second index beside it).
ledger_events = sa.Table(
    "ledger_events",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False),
    # Set on weight_committed rows only (see uq_ledger_events_version below).
    sa.Column("version", sa.BigInteger(), nullable=True),
    sa.Column("cell_id", sa.String(128), nullable=True),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
    # NOT NULL since revision 0002: a NULL never collides in the unique constraint below, so a
    # keyless event could be written twice by a retry.
    sa.Column("idempotency_key", sa.String(256), nullable=False),
    sa.Column("payload", sa.JSON(), nullable=False),
    sa.Column("hash", Digest(), nullable=False),
    sa.Column("recorded_at", UtcTimestamp(), nullable=False),
    # Since revision 0003: the payload's train_step, copied out so that "the batch_trained of
    # step N" is one indexed lookup. Outside the hash (derived); verify checks it equals the
    # payload's.
    sa.Column("train_step", sa.BigInteger(), nullable=True),
    sa.UniqueConstraint("run_id", "idempotency_key", name="uq_ledger_events_idempotency"),
    # One commit per version per run; partial, so the three events a step in four that carry
    # no version take no index entry.
    sa.Index("uq_ledger_events_version", "run_id", "version", unique=True,
             sqlite_where=sa.text("version IS NOT NULL"),
             postgresql_where=sa.text("version IS NOT NULL")),
    # Partial: only batch_trained rows are looked up by step (a quarter of the rows).
    sa.Index("ix_ledger_events_kind_step", "run_id", "kind", "train_step",
             sqlite_where=sa.text("kind = 'batch_trained'"),
             postgresql_where=sa.text("kind = 'batch_trained'")),
    # Since revision 0005: a run's few eval_finished rows, found without reading the run.
    sa.Index("ix_ledger_events_evals", "run_id", "kind", "seq",
             sqlite_where=sa.text("kind = 'eval_finished'"),
             postgresql_where=sa.text("kind = 'eval_finished'")),
    sqlite_with_rowid=False,
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
    # Since revision 0006: the rows of a run's tail (the incremental audit), without its head.
    sa.Index("ix_version_uses_seq", "run_id", "seq"),
    sqlite_with_rowid=False,  # since revision 0004: the key is the table
)


def _stored_state_table(name: str) -> sa.Table:
    """A table of folded states a run stored at a seq, each trusted only while its head_hash
    is the chain's hash at that seq."""
    return sa.Table(
        name,
        metadata,
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
    )


# Read-model snapshots (revision 0003): the run's progress (ledger.progress) folded up to seq;
# readers fold only the tail.
projection_snapshots = _stored_state_table("projection_snapshots")
# Audit checkpoints (revision 0003): the audit's state after it verified a run up to seq,
# so `verify --since-verified` checks only the events after it (head_hash re-checked).
audit_checkpoints = _stored_state_table("audit_checkpoints")

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
