"""Event kinds, their payloads, and the hash that chains them.

An event is immutable once appended. Its ``hash`` is ``sha256`` over a canonical JSON rendering
of every stored field plus the previous event's hash, so changing any stored byte of any event
breaks the chain from that event on (:func:`event_hash`).
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import encode_basestring as _encode_string
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from msgspec import Struct

__all__ = [
    "GENESIS_HASH",
    "UNKNOWN_PREV_HASH",
    "PUBLISHER_KINDS",
    "Event",
    "EventKind",
    "Head",
    "RunRecord",
    "describe_error",
    "event_hash",
    "hash_matches",
    "read_payload",
]

GENESIS_HASH = "0" * 64
# The prev_hash a reader gives an event whose predecessor row is missing (a gap in seq): the
# chain cannot be followed into it, and the audit reports the break instead of judging the hash.
UNKNOWN_PREV_HASH = ""


class EventKind(enum.StrEnum):
    """Every kind of event the ledger stores. Its values are the stored strings (and what the
    hash covers), so ``str()``, f-strings and JSON render a kind as the string stored."""

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
    ACTOR_REPLACED = "actor_replaced"
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


_KNOWN_KINDS: dict[str, EventKind] = {kind.value: kind for kind in EventKind}
_Model = TypeVar("_Model", bound="Struct")


@dataclass(frozen=True)
class Event:
    """One stored ledger event. ``version`` is set on ``weight_committed`` events only.

    ``kind`` is an :class:`EventKind` (a string given for a known kind is turned into one).
    Only a kind this code does not know (a row written by hand or by newer code) stays the
    stored string, so that the audit can still hash it and report it as ``unknown_kind``.
    """

    run_id: str
    seq: int
    kind: EventKind | str
    payload: dict[str, Any]
    recorded_at: datetime
    prev_hash: str
    hash: str
    version: int | None = None
    cell_id: str | None = None
    epoch: int | None = None
    idempotency_key: str | None = None
    # The row's train_step column (revision 0003): derived from the payload, outside the hash,
    # read so that verify can check the two agree (None: not read, or NULL).
    train_step: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _KNOWN_KINDS.get(self.kind)
        if kind is not None and kind is not self.kind:
            object.__setattr__(self, "kind", kind)

    def payload_as(self, model: type[_Model]) -> _Model:
        """The payload read through ``model`` (the kind's own:
        :func:`ledger.payloads.payload_model`), so a missing or mistyped field raises instead
        of reading as a default.

        Raises:
            PayloadError: the payload does not fit ``model``.
        """
        import msgspec

        from ledger.errors import PayloadError

        try:
            return read_payload(self.payload, model)
        except msgspec.ValidationError as exc:
            raise PayloadError(self.run_id, self.seq, str(self.kind),
                               describe_error(exc)) from None

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
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 kept as is (what is hashed)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compact_json(value: Any) -> str:
    """JSON without whitespace, keys in their order: how the store writes JSON columns (a
    reader sees a payload's keys in the order the caller gave them; the hash sorts them)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _scalar(value: Any) -> str:
    # What canonical_json renders for the envelope's fields, without its per-call set-up
    # (the audit hashes every event): strings through the encoder json.dumps itself uses.
    if value is None:
        return "null"
    if type(value) is str:
        return _encode_string(value)
    if type(value) is int:
        return int.__repr__(value)
    return canonical_json(value)


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
    """The chained hash of one event: ``sha256(canonical_json({every stored field,
    prev_hash}))``, with the keys in sorted order.

    ``payload_json`` (``canonical_json(payload)``, if the caller has it: the audit renders each
    payload once for this and for its credential check) is spliced in instead of rendering the
    payload again.
    """
    if payload_json is None:
        payload_json = canonical_json(payload)
    body = (
        f'{{"cell_id":{_scalar(cell_id)},"epoch":{_scalar(epoch)},'
        f'"idempotency_key":{_scalar(idempotency_key)},"kind":{_scalar(str(kind))},'
        f'"payload":{payload_json},"prev_hash":{_scalar(prev_hash)},'
        f'"recorded_at":{_encode_string(recorded_at.isoformat())},"run_id":{_scalar(run_id)},'
        f'"seq":{_scalar(seq)},"version":{_scalar(version)}}}'
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def hash_matches(event: Event) -> tuple[bool, str]:
    """Whether ``event.hash`` is the :func:`event_hash` of the event's stored fields; with the
    payload's canonical JSON (the audit checks it for credentials too).

    The payload is rendered by msgspec first (about 15x faster than ``json.dumps``: the audit
    renders every event's), and that rendering is trusted only if the payload holds no NaN or
    infinity: msgspec writes those as ``null``, and it is otherwise exact, so such a rendering
    that hashes to the stored hash is the text the writer hashed, and the payload read back is
    the payload written. Anything else (a non-finite float, a float msgspec writes in another
    form, a value it cannot write) is rendered by :func:`canonical_json`, the definition.
    """
    fast = _sorted_json(event.payload)
    if fast is not None and _hash_of(event, fast) == event.hash:
        return True, fast
    payload_json = canonical_json(event.payload)
    if payload_json == fast:
        return False, payload_json
    return _hash_of(event, payload_json) == event.hash, payload_json


def _hash_of(event: Event, payload_json: str) -> str:
    return event_hash(
        prev_hash=event.prev_hash, run_id=event.run_id, seq=event.seq, kind=event.kind,
        version=event.version, cell_id=event.cell_id, epoch=event.epoch,
        idempotency_key=event.idempotency_key, payload=event.payload,
        recorded_at=event.recorded_at, payload_json=payload_json)


_SORTED_ENCODER: Any = None


def _sorted_json(value: Any) -> str | None:
    """msgspec's sorted-key JSON of ``value``, or None: it holds a NaN or an infinity (which
    msgspec writes as ``null``), or msgspec cannot write it."""
    global _SORTED_ENCODER
    if _SORTED_ENCODER is None:
        import msgspec

        _SORTED_ENCODER = msgspec.json.Encoder(order="sorted")
    try:
        rendered = _SORTED_ENCODER.encode(value).decode()
    except (TypeError, ValueError, OverflowError):
        return None
    return None if "null" in rendered and _holds_non_finite(value) else rendered


def _holds_non_finite(value: Any) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    if type(value) is dict:
        return any(_holds_non_finite(item) for item in value.values())
    if type(value) is list:
        return any(_holds_non_finite(item) for item in value)
    return False


def read_payload(payload: Any, model: type[_Model]) -> _Model:
    """``payload`` (a stored payload dict) read through ``model`` (a :class:`msgspec.Struct`:
    :mod:`ledger.payloads`): declared fields typed, other keys ignored.

    Raises:
        msgspec.ValidationError: it does not fit (a ``ValueError``); :func:`describe_error`
            words it.
    """
    import msgspec

    return msgspec.convert(payload, model, strict=False)


_FIELD_ERRORS = {"missing required": "Field required",
                 "contains unknown": "Extra inputs are not permitted"}
_FIELD = re.compile(
    r"^Object (?P<error>missing required|contains unknown) field `(?P<field>[^`]*)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")


def describe_error(exc: ValueError) -> str:
    """``where: what`` of a validation error, ``where`` a dotted path into the payload
    (``prompts.trained.0``, or ``payload`` for the whole): ``train_step: Field required``."""
    message = str(exc)
    at = _AT.search(message)
    where = [] if at is None else [
        name or index for name, index in _PATH_PART.findall(at.group("path"))]
    what = message if at is None else message[:at.start()]
    field = _FIELD.match(what)
    if field is not None:
        where.append(field.group("field"))
        what = _FIELD_ERRORS[field.group("error")]
    return f"{'.'.join(where) or 'payload'}: {what}"


