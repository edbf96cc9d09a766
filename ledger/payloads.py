"""Event payloads: one typed model per kind, and the validation every append (and the
audit, on every row it reads back) applies.

The models are :class:`msgspec.Struct` types: validating a payload costs about 2 us and the
module imports in milliseconds, where pydantic models cost 14 us a payload and a quarter of a
second at start-up (issue 22: the audit validates every stored payload, and ``ledger show`` or
``ledger lineage`` validate a few in a process that must answer in under 0.3 s). A model
declares the keys the ledger relies on; other top-level keys are kept (forward compatible,
drills attach context), so ``validate_payload`` writes the declared fields in declaration
order, then the caller's extra keys in its order.

Kept apart from :mod:`ledger.events` so that commands that only read the head (``ledger
status``) do not import the models at start-up.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Literal

import msgspec

from ledger.errors import LedgerError
from ledger.events import EventKind, describe_error, read_payload
from ledger.id_ranges import compact
from ledger.redact import redact_secrets

__all__ = [
    "ActorReplaced",
    "BatchTrained",
    "CellPromoted",
    "CellState",
    "EnginesStamped",
    "Payload",
    "PromptOutcomes",
    "RunFailed",
    "RunFinished",
    "RunStarted",
    "WeightCommitted",
    "WeightUpdateAborted",
    "payload_model",
    "payload_problem",
    "validate_payload",
]

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Transport = Literal["full", "lora"]


class Payload(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every kind's payload model: declared keys are checked, other keys are kept by
    :func:`validate_payload` (and ignored by :func:`ledger.events.read_payload`)."""


class RunStarted(Payload, kw_only=True):
    config: dict[str, Any] = {}


class RunResumed(Payload, kw_only=True):
    """A resume: the checkpoint restored, the head it found, and (provenance) the ledger's last
    trained step, the prompts in flight it carried over and where the prompt stream continues
    (checked against the ledger's own account by ``verify``)."""

    checkpoint_step: NonNegative
    checkpoint_version: NonNegative
    head_version: NonNegative
    ledger_step: NonNegative | None = None
    prompts_carried_over: NonNegative | None = None
    next_prompt_index: NonNegative | None = None


class RunFinished(Payload, kw_only=True):
    steps: NonNegative
    negative_staleness_total: NonNegative = 0


class RunFailed(Payload, kw_only=True):
    """The terminal event of a run that ended on an error (recorded by the control plane; not
    publisher-fenced): why, and the head version it ended at."""

    reason: NonEmpty
    head_version: NonNegative


class CellPromoted(Payload, kw_only=True):
    reason: Literal["start", "failover", "manual", "resume"]
    previous_cell: str | None = None


class CellState(Payload, kw_only=True):
    state: Literal["alive", "errored", "stopped", "healed"]
    quorum_id: int | None = None


class WeightUpdateStarted(Payload, kw_only=True):
    train_step: NonNegative
    transport: Transport


class WeightUpdateAborted(Payload, kw_only=True):
    train_step: NonNegative
    transport: Transport
    reason: str


class WeightCommitted(Payload, kw_only=True):
    train_step: NonNegative
    transport: Transport
    adapter: str | None = None
    checksum: str | None = None


class EnginesStamped(Payload, kw_only=True):
    version: NonNegative
    engine_ids: list[str]


class CheckpointSaved(Payload, kw_only=True):
    train_step: NonNegative
    version: NonNegative
    path: str


class StalenessSummary(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    # Not bounded below: a negative staleness is recorded as it is and the audit reports it.
    min: int
    avg: float
    max: int


PromptIds = list[int | list[int]]


class PromptOutcomes(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Which prompts this step settled, and the prompt stream's position after it.

    Prompt ids are stored as ranges (``[[start, end], ...]``, both ends included; a single id
    may stand alone), so the event is bounded by the number of gaps, not the batch size. A
    payload given as a flat list of ids (what ledgers before revision 0003 stored, and what
    callers may still pass) is accepted and written compacted; readers accept both forms
    (:func:`ledger.id_ranges.iter_ranges`), and the digest covers the same sorted ids either
    way, so old ledgers verify unchanged.
    """

    trained: PromptIds
    dropped: dict[str, PromptIds] = {}
    recycled: NonNegative = 0
    next_index: NonNegative

    def __post_init__(self) -> None:
        # A ValueError here is reported as a validation error of the payload (msgspec wraps it).
        msgspec.structs.force_setattr(self, "trained", compact(self.trained))
        msgspec.structs.force_setattr(
            self, "dropped", {reason: compact(ids) for reason, ids in self.dropped.items()})


class BatchTrained(Payload, kw_only=True):
    """Provenance of one training step (driver-recorded; never per-sample rows)."""

    train_step: Positive
    trainer_version: NonNegative
    produced_version: Positive | None = None
    cells: list[str]
    groups: NonNegative
    samples: NonNegative
    sample_versions: dict[str, int]
    token_version_span_max: NonNegative = 0
    mixed_version_samples: NonNegative = 0
    staleness: StalenessSummary
    prompt_digest: str
    prompts: PromptOutcomes


class EvalFinished(Payload, kw_only=True):
    """One eval set scored on one committed version (driver-recorded, not fenced)."""

    name: NonEmpty
    version: NonNegative
    train_step: NonNegative
    digest: str
    prompts: NonNegative
    samples_per_prompt: Positive
    metrics: dict[str, float]


class ActorReplaced(Payload, kw_only=True):
    """The control plane replaced a rollout engine or the rollout manager (not fenced: the
    supervisor's record, like ``cell_state``): which, and why (``dead``: its process is gone;
    ``frozen``: it gave no answer within its bound). A healed cell is ``cell_state`` healed."""

    actor: Literal["engine", "rollout-manager"]
    actor_id: NonEmpty
    reason: Literal["dead", "frozen"]


class DrillEvent(Payload, kw_only=True):
    scenario: str


_PAYLOAD_MODELS: dict[EventKind, type[Payload]] = {
    EventKind.RUN_STARTED: RunStarted,
    EventKind.RUN_RESUMED: RunResumed,
    EventKind.RUN_FINISHED: RunFinished,
    EventKind.RUN_FAILED: RunFailed,
    EventKind.CELL_PROMOTED: CellPromoted,
    EventKind.CELL_STATE: CellState,
    EventKind.WEIGHT_UPDATE_STARTED: WeightUpdateStarted,
    EventKind.WEIGHT_UPDATE_ABORTED: WeightUpdateAborted,
    EventKind.WEIGHT_COMMITTED: WeightCommitted,
    EventKind.ENGINES_STAMPED: EnginesStamped,
    EventKind.CHECKPOINT_SAVED: CheckpointSaved,
    EventKind.BATCH_TRAINED: BatchTrained,
    EventKind.EVAL_FINISHED: EvalFinished,
    EventKind.ACTOR_REPLACED: ActorReplaced,
    EventKind.DRILL_STARTED: DrillEvent,
    EventKind.FAULT_INJECTED: DrillEvent,
    EventKind.DRILL_VERDICT: DrillEvent,
}


def payload_model(kind: EventKind) -> type[Payload]:
    """The model of ``kind``'s payload (for :meth:`ledger.events.Event.payload_as`)."""
    return _PAYLOAD_MODELS[kind]


# Fields the ledger assigns itself; a caller's payload may not smuggle them in.
_RESERVED_PAYLOAD_KEYS = frozenset({"epoch", "seq", "hash", "prev_hash"})


def validate_payload(kind: str | EventKind, payload: dict[str, Any]) -> tuple[EventKind, dict]:
    """Check ``payload`` against ``kind``'s model and return the kind and a JSON-safe copy:
    the declared fields in declaration order (defaults filled in, prompt ids compacted), then
    the caller's other keys.

    Raises:
        LedgerError: unknown kind, a reserved key, a payload that does not fit its model, or a
            value JSON cannot hold.
    """
    try:
        event_kind = EventKind(kind)
    except ValueError:
        raise LedgerError(f"unknown event kind {kind!r}") from None
    reserved = _RESERVED_PAYLOAD_KEYS & payload.keys()
    if reserved:
        raise LedgerError(f"{event_kind.value}: payload may not set {sorted(reserved)}")
    model = _PAYLOAD_MODELS[event_kind]
    try:
        declared = msgspec.to_builtins(read_payload(payload, model))
        extra = {key: value for key, value in payload.items()
                 if key not in model.__struct_fields__}
        clean = msgspec.to_builtins({**declared, **extra}, enc_hook=_encode_other)
    except msgspec.ValidationError as exc:
        raise LedgerError(f"{event_kind.value}: {describe_error(exc)}") from None
    except TypeError as exc:
        raise LedgerError(f"{event_kind.value}: {exc}") from None
    # Round-trip through JSON so what is hashed now is exactly what is read back later; redact
    # credentials first, as a hash-chained history can never be scrubbed afterwards.
    return event_kind, json.loads(json.dumps(redact_secrets(clean)))


def payload_problem(kind: str, payload: Any) -> str | None:
    """Why a stored ``payload`` does not fit ``kind``'s model (None: it fits). What the audit
    re-checks on every event read back (the append validated it; a raw write may not have).
    """
    try:
        event_kind = EventKind(kind)
    except ValueError:
        return f"unknown event kind {kind!r}"
    if not isinstance(payload, dict):
        return "payload is not an object"
    reserved = _RESERVED_PAYLOAD_KEYS & payload.keys()
    if reserved:
        return f"payload sets {sorted(reserved)}"
    try:
        read_payload(payload, _PAYLOAD_MODELS[event_kind])
    except msgspec.ValidationError as exc:
        return describe_error(exc)
    return None


def _encode_other(value: Any) -> Any:
    """What JSON cannot hold natively but a caller may pass (a path): its text form."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")
