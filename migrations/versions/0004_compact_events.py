"""Compact event rows: no stored prev_hash, the hash as 32 bytes, the time as 8 bytes on
SQLite, one-commit-per-version as a partial unique index, and no rowid on SQLite.

Rewrites how rows are stored, not what they say: every hash is the same digest and every time
the same microsecond, and readers derive ``prev_hash`` as the hash of the row before (the value
every intact ledger stored), so each old hash still verifies. A stored ``prev_hash`` that
disagreed with the row before it was tampered with; the audit then already named the row, and
it still does (its hash no longer matches either way). A hash that is not 64 hex characters
(a hand-edited row) is kept as its text, and the audit reports it.

The downgrade writes ``prev_hash`` back from the row before each event (the genesis hash for a
run's first), the hash as hex and the time as text.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_GENESIS = "0" * 64
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_EPOCH = datetime(1970, 1, 1)
_COMMON = ("run_id, seq, kind, version, cell_id, epoch, idempotency_key, payload")


def _sqlite_unhex(value: Any) -> Any:
    return bytes.fromhex(value) if isinstance(value, str) and _HEX_DIGEST.fullmatch(value) \
        else value


def _sqlite_micros(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    return (datetime.fromisoformat(value) - _EPOCH) // timedelta(microseconds=1)


def _sqlite_time_text(value: Any) -> Any:
    if not isinstance(value, int):
        return value
    return (_EPOCH + timedelta(microseconds=value)).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_hex(value: Any) -> Any:
    return bytes(value).hex() if isinstance(value, bytes) else value


def _register(functions: dict[str, Any]) -> None:
    dbapi = op.get_bind().connection.dbapi_connection
    for name, function in functions.items():
        dbapi.create_function(name, 1, function, deterministic=True)


def _events_table(name: str, compact: bool) -> None:
    digest = sa.LargeBinary(32) if compact else sa.String(64)
    columns = [
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=True),
        sa.Column("cell_id", sa.String(128), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("idempotency_key", sa.String(256), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        *([] if compact else [sa.Column("prev_hash", sa.String(64), nullable=False)]),
        sa.Column("hash", digest, nullable=False),
        sa.Column("recorded_at", sa.BigInteger() if compact else sa.DateTime(), nullable=False),
        sa.Column("train_step", sa.BigInteger(), nullable=True),
        sa.UniqueConstraint("run_id", "idempotency_key", name="uq_ledger_events_idempotency"),
        *([] if compact else
          [sa.UniqueConstraint("run_id", "version", name="uq_ledger_events_version")]),
    ]
    op.create_table(name, *columns, **({"sqlite_with_rowid": False} if compact else {}))


def _uses_table(name: str, compact: bool) -> None:
    op.create_table(
        name,
        sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("version", sa.BigInteger(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("train_step", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        **({"sqlite_with_rowid": False} if compact else {}),
    )


def _step_index() -> None:
    op.create_index("ix_ledger_events_kind_step", "ledger_events",
                    ["run_id", "kind", "train_step"],
                    sqlite_where=sa.text("kind = 'batch_trained'"),
                    postgresql_where=sa.text("kind = 'batch_trained'"))


def _version_index() -> None:
    op.create_index("uq_ledger_events_version", "ledger_events", ["run_id", "version"],
                    unique=True, sqlite_where=sa.text("version IS NOT NULL"),
                    postgresql_where=sa.text("version IS NOT NULL"))


def _swap(table: str, select: str, create: Any, compact: bool) -> None:
    """SQLite: rebuild ``table`` in its other shape, rows copied through ``select``."""
    create(f"_{table}_0004", compact)
    op.execute(f"INSERT INTO _{table}_0004 {select}")
    op.drop_table(table)
    op.rename_table(f"_{table}_0004", table)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _register({"ledger_unhex": _sqlite_unhex, "ledger_micros": _sqlite_micros})
        _swap("ledger_events", f"SELECT {_COMMON}, ledger_unhex(hash), "
              "ledger_micros(recorded_at), train_step FROM ledger_events", _events_table, True)
        _swap("version_uses", "SELECT * FROM version_uses", _uses_table, True)
        _version_index()
        _step_index()
        return
    op.drop_column("ledger_events", "prev_hash")
    op.execute("ALTER TABLE ledger_events ALTER COLUMN hash TYPE bytea USING CASE WHEN "
               "hash ~ '^[0-9a-f]{64}$' THEN decode(hash, 'hex') "
               "ELSE convert_to(hash, 'UTF8') END")
    op.drop_constraint("uq_ledger_events_version", "ledger_events", type_="unique")
    _version_index()


_PREV_HASH = (f"COALESCE(LAG({{hex}}) OVER (PARTITION BY run_id ORDER BY seq), '{_GENESIS}')")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _register({"ledger_hex": _sqlite_hex, "ledger_time_text": _sqlite_time_text})
        _swap("ledger_events", f"SELECT {_COMMON}, {_PREV_HASH.format(hex='ledger_hex(hash)')}, "
              "ledger_hex(hash), ledger_time_text(recorded_at), train_step FROM ledger_events",
              _events_table, False)
        _swap("version_uses", "SELECT * FROM version_uses", _uses_table, False)
        _step_index()
        return
    op.drop_index("uq_ledger_events_version", "ledger_events")
    op.create_unique_constraint("uq_ledger_events_version", "ledger_events",
                                ["run_id", "version"])
    op.execute("ALTER TABLE ledger_events ALTER COLUMN hash TYPE varchar(64) "
               "USING encode(hash, 'hex')")
    op.add_column("ledger_events", sa.Column("prev_hash", sa.String(64), nullable=True))
    op.execute(f"UPDATE ledger_events AS e SET prev_hash = p.prev FROM (SELECT run_id, seq, "
               f"{_PREV_HASH.format(hex='hash')} AS prev FROM ledger_events) AS p "
               "WHERE e.run_id = p.run_id AND e.seq = p.seq")
    op.alter_column("ledger_events", "prev_hash", nullable=False)
