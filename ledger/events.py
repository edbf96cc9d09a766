"""Event kinds, their payloads, and the hash that chains them.

An event is immutable once appended. Its ``hash`` is ``sha256`` over a canonical JSON rendering
of every stored field plus the previous event's hash, so changing any stored byte of any event
breaks the chain from that event on (:func:`event_hash`).
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


__all__ = [
    "GENESIS_HASH",
    "PUBLISHER_KINDS",
    "Event",
    "EventKind",
    "Head",
    "RunRecord",
    "event_hash",
]

GENESIS_HASH = "0" * 64


class EventKind(str, enum.Enum):
    """Every kind of event the ledger stores."""

    RUN_STARTED = "run_started"
    RUN_RESUMED = "run_resumed"
    RUN_FINISHED = "run_finished"
    RUN_FAILED = "run_failed"
    CELL_PROMOTED = "cell_promoted"
    CELL_STATE = "cell_state"
    WEIGHT_UPDATE_STARTED = "weight_update_started"
    WEIGHT_UPDATE_ABORTED = "weight_update_aborted"
    WEIGHT_COMMITTED = "weight_committed"
    ENGINES_STAMPED = "engines_stamped"
    CHECKPOINT_SAVED = "checkpoint_saved"
    BATCH_TRAINED = "batch_trained"
    EVAL_FINISHED = "eval_finished"
    DRILL_STARTED = "drill_started"
    FAULT_INJECTED = "fault_injected"
    DRILL_VERDICT = "drill_verdict"


# Events that only the newest promoted cell may append, and only with its epoch.
PUBLISHER_KINDS = frozenset(
    {
        EventKind.WEIGHT_UPDATE_STARTED,
        EventKind.WEIGHT_UPDATE_ABORTED,
        EventKind.WEIGHT_COMMITTED,
        EventKind.ENGINES_STAMPED,
        EventKind.CHECKPOINT_SAVED,
    }
)


@dataclass(frozen=True)
class Event:
    """One stored ledger event. ``version`` is set on ``weight_committed`` events only."""

    run_id: str
    seq: int
    kind: str
    payload: dict[str, Any]
    recorded_at: datetime
    prev_hash: str
    hash: str
    version: int | None = None
    cell_id: str | None = None
    epoch: int | None = None
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready rendering that holds every stored field (lossless)."""
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "kind": self.kind,
            "version": self.version,
            "cell_id": self.cell_id,
            "epoch": self.epoch,
            "idempotency_key": self.idempotency_key,
            "payload": self.payload,
            "recorded_at": self.recorded_at.isoformat(),
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


@dataclass(frozen=True)
class Head:
    """The run's head row: newest committed version, newest epoch and its cell, last seq."""

    version: int
    epoch: int
    publisher_cell: str | None
    seq: int
    hash: str = field(default=GENESIS_HASH)


@dataclass(frozen=True)
class RunRecord:
    """What the ``runs`` and ``run_heads`` tables hold for one run id (either may be missing:
    a damaged ledger is still listed and audited, not hidden)."""

    run_id: str
    created_at: datetime | None  # None: no ``runs`` row
    config: dict[str, Any] | None  # None: no ``runs`` row
    head: Head | None  # None: no ``run_heads`` row
    last_event_seq: int | None = None  # the newest event's seq (None: no events)

    @property
    def has_run_row(self) -> bool:
        return self.created_at is not None

    @property
    def problems(self) -> tuple[str, ...]:
        """What is missing, in words (empty for a healthy run)."""
        missing = []
        if not self.has_run_row:
            missing.append("no runs row")
        if self.head is None:
            missing.append("no head row")
        if self.last_event_seq is None:
            missing.append("no events")
        return tuple(missing)


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(
    *,
    prev_hash: str,
    run_id: str,
    seq: int,
    kind: str,
    version: int | None,
    cell_id: str | None,
    epoch: int | None,
    idempotency_key: str | None,
    payload: dict[str, Any],
    recorded_at: datetime,
    payload_json: str | None = None,
) -> str:
    """The chained hash of one event: ``sha256(canonical(prev_hash, event))``.

    ``payload_json`` (``canonical_json(payload)``, if the caller has it) is spliced in instead
    of rendering the payload again: the audit renders each payload once for this and for its
    credential check.
    """
    if payload_json is not None:
        envelope = canonical_json({
            "prev_hash": prev_hash, "run_id": run_id, "seq": seq, "kind": kind,
            "version": version, "cell_id": cell_id, "epoch": epoch,
            "idempotency_key": idempotency_key, "recorded_at": recorded_at.isoformat(),
        })
        # Keys are sorted: "payload" sits right before "prev_hash", and the text ',"prev_hash":'
        # cannot occur inside an earlier JSON string (its quotes would be escaped).
        cut = envelope.index(',"prev_hash":')
        body = f'{envelope[:cut]},"payload":{payload_json}{envelope[cut:]}'
        return hashlib.sha256(body.encode("utf-8")).hexdigest()
    body = canonical_json(
        {
            "prev_hash": prev_hash,
            "run_id": run_id,
            "seq": seq,
            "kind": kind,
            "version": version,
            "cell_id": cell_id,
            "epoch": epoch,
            "idempotency_key": idempotency_key,
            "payload": payload,
            "recorded_at": recorded_at.isoformat(),
        }
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()
