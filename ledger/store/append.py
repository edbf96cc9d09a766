"""The locked append: the one code path that writes an event, inside the caller's transaction.

:func:`lock_head` takes the run's lock; :func:`append_locked` checks idempotency and fencing,
assigns ``seq`` (and ``version`` for a commit), chains the hash, inserts the event and moves the
head row, all in that one transaction. :func:`create_run_locked` writes a new run's rows.
The callers (:class:`ledger.store.Ledger`) own the transaction and its retries.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ledger.errors import FencedError, IdempotencyConflictError, LedgerError
from ledger.events import (
    GENESIS_HASH,
    PUBLISHER_KINDS,
    Event,
    EventKind,
    Head,
    event_hash,
)
from ledger.schema import ledger_events, run_heads, runs, version_uses
from ledger.store.codecs import chained_prev_hash

__all__ = [
    "IDENTITY_PAYLOAD_KEYS",
    "PREV_HASH",
    "chained_prev_hash",
    "append_locked",
    "create_run_locked",
    "lock_head",
    "row_to_event",
]


# Built once (as the head read is): building a statement costs as much as running it on SQLite,
# and an append runs four of them.
_INSERT_EVENT = ledger_events.insert()
_INSERT_USES = version_uses.insert()
_LOCK_HEAD = sa.select(run_heads).where(run_heads.c.run_id == sa.bindparam("run_id"))
_LOCK_HEAD_FOR_UPDATE = _LOCK_HEAD.with_for_update()
_MOVE_HEAD = run_heads.update().where(run_heads.c.run_id == sa.bindparam("head_run_id"))


def _utcnow() -> datetime:
    # Stored naive, in UTC: both backends round-trip it to the microsecond, which the hash needs.
    return datetime.now(UTC).replace(tzinfo=None)


_PREVIOUS = ledger_events.alias("previous")
# prev_hash is not stored (since revision 0004): it is the hash of the row before, selected
# beside an event as this labelled column (NULL for seq 1, or when the row before is missing).
PREV_HASH = (
    sa.select(_PREVIOUS.c.hash)
    .where(_PREVIOUS.c.run_id == ledger_events.c.run_id,
           _PREVIOUS.c.seq == ledger_events.c.seq - 1)
    .scalar_subquery()
    .label("prev_hash")
)
_BY_IDEMPOTENCY_KEY = sa.select(ledger_events, PREV_HASH).where(
    ledger_events.c.run_id == sa.bindparam("run_id"),
    ledger_events.c.idempotency_key == sa.bindparam("idempotency_key"),
)


def row_to_event(row: sa.Row) -> Event:
    """A ``ledger_events`` row selected with :data:`PREV_HASH` as an :class:`Event` (payload
    decoded if the driver did not).

    Raises:
        ValueError: the payload is not JSON.
    """
    return Event(
        run_id=row.run_id,
        seq=row.seq,
        kind=row.kind,
        payload=row.payload if isinstance(row.payload, dict) else json.loads(row.payload),
        recorded_at=row.recorded_at,
        prev_hash=chained_prev_hash(row.seq, row.prev_hash),
        hash=row.hash,
        version=row.version,
        cell_id=row.cell_id,
        epoch=row.epoch,
        idempotency_key=row.idempotency_key,
        train_step=getattr(row, "train_step", None),
    )


# Payload fields that say *which* event a key names. A retry must repeat them exactly; the
# others describe what the caller observed (engine_ids, reason, config) and may differ between
# attempts without making the retry a different event.
IDENTITY_PAYLOAD_KEYS = ("train_step", "transport", "adapter", "checksum", "version")


def _differences(
    stored: Event,
    kind: EventKind,
    cell_id: str | None,
    epoch: int | None,
    payload: dict[str, Any],
) -> list[str]:
    """How a retry with the same idempotency key differs from the event the key names."""
    pairs: list[tuple[str, Any, Any]] = [
        ("kind", stored.kind, kind.value),
        ("cell", stored.cell_id, cell_id),
    ]
    if epoch is not None:  # a promotion's epoch is assigned by the ledger, not the caller
        pairs.append(("epoch", stored.epoch, epoch))
    pairs.extend(
        (key, stored.payload.get(key), payload.get(key))
        for key in IDENTITY_PAYLOAD_KEYS
        if key in stored.payload or key in payload
    )
    return [f"{name} {was!r} != {now!r}" for name, was, now in pairs if was != now]


def lock_head(conn: sa.Connection, run_id: str) -> Head | None:
    """Lock the run's head row for this transaction and return it (None: no such run)."""
    # Why seq and version are gapless and in commit order: every append of a run first
    # takes this row's lock (FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already
    # holds the database write lock), reads last_seq/head_version, writes +1 and updates
    # this row in the same transaction. A second appender blocks here until the first
    # commits or rolls back, so no two transactions can read the same last_seq, and a
    # rolled-back append leaves no hole: the numbers are taken only by what commits.
    # (A sequence or autoincrement would hand out numbers at insert time instead: a rollback
    # leaves a gap, and two inserts can become visible in the other order.)
    query = _LOCK_HEAD_FOR_UPDATE if conn.dialect.name == "postgresql" else _LOCK_HEAD
    row = conn.execute(query, {"run_id": run_id}).first()
    if row is None:
        return None
    return Head(
        version=row.head_version,
        epoch=row.epoch,
        publisher_cell=row.publisher_cell,
        seq=row.last_seq,
        hash=row.head_hash,
    )


def create_run_locked(conn: sa.Connection, run_id: str, config: dict[str, Any]) -> Event:
    """Insert a new run's ``runs`` and head rows and append its ``run_started`` event.

    Precondition: inside a write transaction in which :func:`lock_head` found no head row.
    A concurrent starter makes the inserts fail on the primary key; the caller reads the winner.
    """
    conn.execute(runs.insert().values(run_id=run_id, created_at=_utcnow(), config=config))
    conn.execute(
        run_heads.insert().values(
            run_id=run_id,
            last_seq=0,
            head_version=0,
            epoch=0,
            publisher_cell=None,
            head_hash=GENESIS_HASH,
        )
    )
    head = lock_head(conn, run_id)
    assert head is not None
    return append_locked(
        conn, head, run_id, EventKind.RUN_STARTED, {"config": config},
        cell_id=None, epoch=None, idempotency_key=f"run_started:{run_id}",
    )


def append_locked(
    conn: sa.Connection,
    head: Head,
    run_id: str,
    kind: EventKind,
    payload: dict[str, Any],
    *,
    cell_id: str | None,
    epoch: int | None,
    idempotency_key: str,
) -> Event:
    """Append one event at ``head.seq + 1``; the caller holds ``head`` locked (:func:`lock_head`).

    Returns the stored event, or the event the idempotency key already names when this call
    repeats it (same kind, cell, epoch and identity fields; nothing written).

    Raises:
        IdempotencyConflictError: the key names an event with other parameters (kind, cell,
            epoch, train step, transport, adapter, checksum, version); nothing written.
        FencedError: a publisher kind from a cell/epoch that is not the newest promotion.
        LedgerError: a promotion or cell state without a cell, a promotion with a wrong
            epoch, or engines stamped ahead of the head.
    """
    existing = conn.execute(
        _BY_IDEMPOTENCY_KEY, {"run_id": run_id, "idempotency_key": idempotency_key}
    ).first()
    if existing is not None:
        stored = row_to_event(existing)
        differences = _differences(stored, kind, cell_id, epoch, payload)
        if differences:
            raise IdempotencyConflictError(
                f"run {run_id!r}: idempotency key {idempotency_key!r} already names "
                f"{stored.kind} at seq {stored.seq} with other parameters: "
                + "; ".join(differences)
            )
        return stored

    version: int | None = None
    new_head = head
    if kind in PUBLISHER_KINDS:
        if head.epoch == 0 or cell_id != head.publisher_cell or epoch != head.epoch:
            raise FencedError(run_id, cell_id, epoch, head.publisher_cell, head.epoch)
    if kind is EventKind.CELL_PROMOTED:
        if not cell_id:
            raise LedgerError("cell_promoted needs a cell_id")
        if epoch is not None and epoch != head.epoch + 1:
            raise LedgerError(f"cell_promoted must carry epoch {head.epoch + 1}, not {epoch}")
        epoch = head.epoch + 1
        new_head = Head(head.version, epoch, cell_id, head.seq, head.hash)
    elif kind is EventKind.CELL_STATE and not cell_id:
        raise LedgerError("cell_state needs a cell_id")
    elif kind is EventKind.WEIGHT_COMMITTED:
        version = head.version + 1
        new_head = Head(version, head.epoch, head.publisher_cell, head.seq, head.hash)
    elif kind is EventKind.ENGINES_STAMPED and payload["version"] > head.version:
        raise LedgerError(
            f"cannot stamp engines with version {payload['version']}: head is {head.version}"
        )

    seq = head.seq + 1
    recorded_at = _utcnow()
    digest = event_hash(
        prev_hash=head.hash, run_id=run_id, seq=seq, kind=kind.value, version=version,
        cell_id=cell_id, epoch=epoch, idempotency_key=idempotency_key, payload=payload,
        recorded_at=recorded_at,
    )
    train_step = payload.get("train_step")
    conn.execute(
        _INSERT_EVENT,
        {"run_id": run_id, "seq": seq, "kind": kind.value, "version": version,
         "cell_id": cell_id, "epoch": epoch, "idempotency_key": idempotency_key,
         "payload": payload, "hash": digest, "recorded_at": recorded_at,
         "train_step": train_step if isinstance(train_step, int) else None},
    )
    uses = [{"run_id": run_id, "version": int(used), "seq": seq, "train_step": train_step,
             "samples": int(samples)}
            for used, samples in payload.get("sample_versions", {}).items()
            ] if kind is EventKind.BATCH_TRAINED else []
    if uses:
        conn.execute(_INSERT_USES, uses)
    conn.execute(
        _MOVE_HEAD,
        {"head_run_id": run_id, "last_seq": seq, "head_version": new_head.version,
         "epoch": new_head.epoch, "publisher_cell": new_head.publisher_cell,
         "head_hash": digest},
    )
    return Event(
        run_id=run_id, seq=seq, kind=kind.value, payload=payload, recorded_at=recorded_at,
        prev_hash=head.hash, hash=digest, version=version, cell_id=cell_id, epoch=epoch,
        idempotency_key=idempotency_key,
    )
