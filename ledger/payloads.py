"""Event payloads: one pydantic model per kind, and the validation every append (and the
audit, on every row it reads back) applies.

Kept apart from :mod:`ledger.events` so that commands that only read the head (``ledger
status``) do not build the models at start-up.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ledger.errors import LedgerError
from ledger.events import EventKind
from ledger.id_ranges import compact
from ledger.redact import redact_secrets

__all__ = [
    "BatchTrained",
    "CellPromoted",
    "CellState",
    "EnginesStamped",
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


class _Payload(BaseModel):
    # Extra keys are kept (forward compatible, drills attach context); declared keys are checked.
    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


class RunStarted(_Payload):
    config: dict[str, Any] = Field(default_factory=dict)


class RunResumed(_Payload):
    """A resume: the checkpoint restored, the head it found, and (provenance) the ledger's last
    trained step, the prompts in flight it carried over and where the prompt stream continues
    (checked against the ledger's own account by ``verify``)."""

    checkpoint_step: int = Field(ge=0)
    checkpoint_version: int = Field(ge=0)
    head_version: int = Field(ge=0)
    ledger_step: int | None = Field(default=None, ge=0)
    prompts_carried_over: int | None = Field(default=None, ge=0)
    next_prompt_index: int | None = Field(default=None, ge=0)


class RunFinished(_Payload):
    steps: int = Field(ge=0)
    negative_staleness_total: int = Field(default=0, ge=0)


class RunFailed(_Payload):
    """The terminal event of a run that ended on an error (recorded by the control plane; not
    publisher-fenced): why, and the head version it ended at."""

    reason: str = Field(min_length=1)
    head_version: int = Field(ge=0)


class CellPromoted(_Payload):
    reason: Literal["start", "failover", "manual", "resume"]
    previous_cell: str | None = None


class CellState(_Payload):
    state: Literal["alive", "errored", "stopped", "healed"]
    quorum_id: int | None = None


class WeightUpdateStarted(_Payload):
    train_step: int = Field(ge=0)
    transport: Literal["full", "lora"]


class WeightUpdateAborted(_Payload):
    train_step: int = Field(ge=0)
    transport: Literal["full", "lora"]
    reason: str


class WeightCommitted(_Payload):
    train_step: int = Field(ge=0)
    transport: Literal["full", "lora"]
    adapter: str | None = None
    checksum: str | None = None


class EnginesStamped(_Payload):
    version: int = Field(ge=0)
    engine_ids: list[str]


class CheckpointSaved(_Payload):
    train_step: int = Field(ge=0)
    version: int = Field(ge=0)
    path: str


class StalenessSummary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    # Not bounded below: a negative staleness is recorded as it is and the audit reports it.
    min: int
    avg: float
    max: int


PromptIds = list[int | list[int]]


class PromptOutcomes(BaseModel):
    """Which prompts this step settled, and the prompt stream's position after it.

    Prompt ids are stored as ranges (``[[start, end], ...]``, both ends included; a single id
    may stand alone), so the event is bounded by the number of gaps, not the batch size. A
    payload given as a flat list of ids (what ledgers before revision 0003 stored, and what
    callers may still pass) is accepted and written compacted; readers accept both forms
    (:func:`ledger.id_ranges.iter_ranges`), and the digest covers the same sorted ids either
    way, so old ledgers verify unchanged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    trained: PromptIds
    dropped: dict[str, PromptIds] = Field(default_factory=dict)
    recycled: int = Field(default=0, ge=0)
    next_index: int = Field(ge=0)

    @field_validator("trained")
    @classmethod
    def _compact_trained(cls, items: PromptIds) -> list[int | list[int]]:
        return compact(items)

    @field_validator("dropped")
    @classmethod
    def _compact_dropped(cls, groups: dict[str, PromptIds]) -> dict[str, list[int | list[int]]]:
        return {reason: compact(items) for reason, items in groups.items()}


class BatchTrained(_Payload):
    """Provenance of one training step (driver-recorded; never per-sample rows)."""

    train_step: int = Field(ge=1)
    trainer_version: int = Field(ge=0)
    produced_version: int | None = Field(default=None, ge=1)
    cells: list[str]
    groups: int = Field(ge=0)
    samples: int = Field(ge=0)
    sample_versions: dict[str, int]
    token_version_span_max: int = Field(default=0, ge=0)
    mixed_version_samples: int = Field(default=0, ge=0)
    staleness: StalenessSummary
    prompt_digest: str
    prompts: PromptOutcomes


class EvalFinished(_Payload):
    """One eval set scored on one committed version (driver-recorded, not fenced)."""

    name: str = Field(min_length=1)
    version: int = Field(ge=0)
    train_step: int = Field(ge=0)
    digest: str
    prompts: int = Field(ge=0)
    samples_per_prompt: int = Field(ge=1)
    metrics: dict[str, float]


class DrillEvent(_Payload):
    scenario: str


_PAYLOAD_MODELS: dict[EventKind, type[_Payload]] = {
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
    EventKind.DRILL_STARTED: DrillEvent,
    EventKind.FAULT_INJECTED: DrillEvent,
    EventKind.DRILL_VERDICT: DrillEvent,
}


def payload_model(kind: EventKind) -> type[_Payload]:
    """The pydantic model of ``kind``'s payload (for :meth:`ledger.events.Event.payload_as`)."""
    return _PAYLOAD_MODELS[kind]


# Fields the ledger assigns itself; a caller's payload may not smuggle them in.
_RESERVED_PAYLOAD_KEYS = frozenset({"epoch", "seq", "hash", "prev_hash"})


def validate_payload(kind: str | EventKind, payload: dict[str, Any]) -> tuple[EventKind, dict]:
    """Check ``payload`` against ``kind``'s model and return the kind and a JSON-safe copy.

    Raises:
        LedgerError: unknown kind, a reserved key, or a payload that does not fit its model.
    """
    try:
        event_kind = EventKind(kind)
    except ValueError:
        raise LedgerError(f"unknown event kind {kind!r}") from None
    reserved = _RESERVED_PAYLOAD_KEYS & payload.keys()
    if reserved:
        raise LedgerError(f"{event_kind.value}: payload may not set {sorted(reserved)}")
    try:
        model = _PAYLOAD_MODELS[event_kind].model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise LedgerError(f"{event_kind.value}: {where}: {first['msg']}") from None
    # Round-trip through JSON so what is hashed now is exactly what is read back later; redact
    # credentials first, as a hash-chained history can never be scrubbed afterwards.
    return event_kind, json.loads(json.dumps(redact_secrets(model.model_dump(mode="json"))))


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
        _PAYLOAD_MODELS[event_kind].model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        return f"{where}: {first['msg']}"
    return None
