"""Stored states: read-model snapshots and audit checkpoints, written beside the events.

Both tables hold ``(run_id, seq, head_hash, state)``: a fold of the run up to ``seq`` and the
chain's hash there. Writing one is idempotent (a state already stored at that seq is kept: it
is the fold of the same events) and never touches an event or the head row, so it needs no
head-row lock and a failure loses nothing but time.

Only the run's newest :data:`KEPT_STATES` of each are kept: a reader or an audit starts from
the newest one whose hash is the chain's (falling back past a forged or stale one, and to
event 1 without any), so older ones serve nobody, and a state grows with the run (the prompt
account holds a range per step: about 2 MB at 100k steps), so keeping one every K steps
would grow the database with the square of the run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ledger.schema import audit_checkpoints, projection_snapshots

__all__ = ["KEPT_STATES", "STATE_TABLES", "store_state"]

KEPT_STATES = 4

STATE_TABLES = {"projection_snapshots": projection_snapshots,
                "audit_checkpoints": audit_checkpoints}


def store_state(conn: sa.Connection, table: str, run_id: str, seq: int, head_hash: str,
                state: dict[str, Any]) -> bool:
    """Insert the state at ``seq`` unless one is stored there; returns whether it inserted.

    Precondition: inside a write transaction.
    """
    chosen = STATE_TABLES[table]
    exists = conn.execute(
        sa.select(chosen.c.seq).where(chosen.c.run_id == run_id, chosen.c.seq == seq)
    ).first()
    if exists is not None:
        return False
    conn.execute(chosen.insert().values(
        run_id=run_id, seq=seq, head_hash=head_hash, state=state,
        recorded_at=datetime.now(UTC).replace(tzinfo=None),
    ))
    oldest_kept = conn.execute(
        sa.select(chosen.c.seq).where(chosen.c.run_id == run_id)
        .order_by(chosen.c.seq.desc()).offset(KEPT_STATES - 1).limit(1)
    ).scalar()
    if oldest_kept is not None:
        conn.execute(chosen.delete().where(chosen.c.run_id == run_id, chosen.c.seq < oldest_kept))
    return True
