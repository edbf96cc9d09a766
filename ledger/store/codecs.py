"""How an event's hash and time are stored, and raw rows decoded into events, heads and runs,
without SQLAlchemy.

Since revision 0004 (issue 22: a run writes four rows a step for hundreds of thousands of
steps, so each row's bytes add up) a digest is 64 hex characters in Python (the chain,
witnesses, CLI) and its 32 bytes in the database; a naive UTC time is integer microseconds
since the epoch on SQLite (whose DATETIME is 26 characters of text) and the native 8-byte
timestamp on PostgreSQL. Both round-trip exactly, as the hash needs. The SQLAlchemy types in
:mod:`ledger.schema` and the plain-SQL readers (:mod:`ledger.store.reads`) both decode here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from ledger.events import GENESIS_HASH, UNKNOWN_PREV_HASH, Event, Head

__all__ = [
    "SCHEMA_HEAD",
    "RunRow",
    "chained_prev_hash",
    "decode_json",
    "digest_hex",
    "event_from_row",
    "event_with_prev_hash",
    "head_from_row",
    "micros_since_epoch",
    "run_row_from",
    "time_from_stored",
]

# The newest schema revision, whose rows these decode (migrations/versions; a test checks it
# is Alembic's head). Here, not in ledger.migrate, so the plain-driver reads check it too.
SCHEMA_HEAD = "0006"
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def micros_since_epoch(moment: datetime) -> int:
    """A naive UTC time as whole microseconds since 1970-01-01 (exact)."""
    return (moment - _EPOCH) // _MICROSECOND


def time_from_stored(value: Any) -> datetime:
    """A stored event time as a naive UTC datetime: SQLite's integer microseconds, a driver's
    datetime, or ISO text (what a row written by hand may hold).

    Raises:
        ValueError, TypeError: anything else.
    """
    if isinstance(value, datetime):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _EPOCH + timedelta(microseconds=value)
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    raise TypeError(f"not a time: {value!r}")


def digest_hex(value: Any) -> str:
    """A stored digest as hex text: raw bytes (bytes or a driver's memoryview) are encoded;
    text (a row written by hand) is returned as it is, for the audit to judge."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


def chained_prev_hash(seq: int, hash_before: str | None) -> str:
    """The ``prev_hash`` of the event at ``seq``, given the hash of the row at ``seq - 1``
    (None: no such row): the genesis hash for the first event, :data:`UNKNOWN_PREV_HASH` for
    an event whose predecessor is missing (a gap the audit reports)."""
    if seq == 1:
        return GENESIS_HASH
    return UNKNOWN_PREV_HASH if hash_before is None else hash_before


def decode_json(value: Any) -> Any:
    """A JSON column's value: SQLite returns text, PostgreSQL's driver the decoded value."""
    return json.loads(value) if isinstance(value, str) else value


def event_from_row(row: Sequence[Any], prev_hash: str, digest: str | None = None) -> Event:
    """An event from a raw row (SQLite: JSON as text, time as integer microseconds;
    PostgreSQL: decoded), chained to ``prev_hash``; ``digest`` is the row's hash as hex, if
    the caller has decoded it already.

    Raises:
        ValueError, TypeError: corrupt JSON or time.
    """
    (run_id, seq, kind, version, cell_id, epoch, key, payload, stored_hash, recorded_at,
     train_step) = row[:11]
    if not isinstance(payload, dict):
        payload = json.loads(payload)
        if not isinstance(payload, dict):
            raise ValueError("payload is not a JSON object")
    if digest is None:
        digest = digest_hex(stored_hash)
    return Event(run_id=run_id, seq=seq, kind=kind, payload=payload,
                 recorded_at=time_from_stored(recorded_at), prev_hash=prev_hash, hash=digest,
                 version=version, cell_id=cell_id, epoch=epoch, idempotency_key=key,
                 train_step=train_step)


def event_with_prev_hash(row: Sequence[Any]) -> Event:
    """An event selected with its predecessor's hash as the last column."""
    before = None if row[11] is None else digest_hex(row[11])
    return event_from_row(row, chained_prev_hash(row[1], before))


def head_from_row(row: Sequence[Any]) -> Head:
    """A head row (``head_version, epoch, publisher_cell, last_seq, head_hash``) as a
    :class:`Head`."""
    return Head(row[0], row[1], row[2], row[3], row[4])


class RunRow(NamedTuple):
    """A ``runs`` row, decoded."""

    run_id: str
    created_at: datetime
    config: Any


def run_row_from(row: Sequence[Any]) -> RunRow:
    """A ``runs`` row, its time and config decoded (SQLite returns both as text)."""
    return RunRow(row[0], time_from_stored(row[1]), decode_json(row[2]))
