"""The run's progress: the compact read model that a resume and ``ledger prompts`` need, and
that a read-model snapshot holds.

:class:`Progress` folds, in seq order, what stays small however long the run is: the head
fields, the prompt account (:class:`~ledger.provenance.PromptLedger`, held as id ranges), which
train steps are recorded (ranges), the newest checkpoint, promotions, resumes, and the outcome.
Per-version and per-step detail (commits, stamps, batches) is not here: those are indexed
lookups (:mod:`ledger.store.lookups`).

A snapshot (``projection_snapshots``) is ``Progress.to_json()`` at some seq with the chain's
hash at that seq; :func:`load_progress` trusts one only if that hash is still the chain's, then
folds the events after it. ``ledger verify`` re-folds every run and reports a snapshot that
disagrees (``snapshot_mismatch``) or whose hash is not the chain's (``snapshot_hash``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger.events import GENESIS_HASH, Event, EventKind
from ledger.id_ranges import IdMap
from ledger.provenance import BatchView, PromptLedger, parse_batch

__all__ = [
    "EngineStamps",
    "Progress",
    "ProgressSource",
    "load_engine_stamps",
    "load_progress",
    "trusted_snapshot",
]

# Bumped when to_json changes; a snapshot of another format is not used. Format 3 (issue 22)
# writes the id maps' progression rows (ledger.id_ranges); format 2 is the same state without
# them, still read, and still what verify compares a format-2 snapshot with.
STATE_FORMAT = 3
READABLE_FORMATS = (2, 3)


@dataclass
class Progress:
    """A run as of ``last_seq``, in the compact form a snapshot holds."""

    last_seq: int = 0
    head_hash: str = GENESIS_HASH
    head_version: int = 0
    epoch: int = 0
    publisher_cell: str | None = None
    prompts: PromptLedger = field(default_factory=PromptLedger)
    steps: IdMap[bool] = field(default_factory=IdMap)  # train steps with a batch_trained
    last_step_seq: int | None = None  # seq of the newest step's (first) batch_trained
    last_checkpoint: dict[str, Any] | None = None  # {"seq", "payload"} of the newest one
    checkpoints: int = 0
    promotions: int = 0
    resumes: int = 0
    malformed: int = 0  # batch_trained rows that do not fit their model (verify names them)
    outcome: str | None = None
    # engine -> [stamped version, seq of that stamp, node_id, host] (``ledger lag``)
    engines: dict[str, list[Any]] = field(default_factory=dict)
    stamped: IdMap[bool] = field(default_factory=IdMap)  # versions some engine was stamped with

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed versions (1..head) that no ``engines_stamped`` names."""
        missing: list[int] = []
        cursor = 1
        for start, end, _ in self.stamped.ranges():
            if start > self.head_version:
                break
            missing.extend(range(cursor, min(start, self.head_version + 1)))
            cursor = max(cursor, end + 1)
        missing.extend(range(cursor, self.head_version + 1))
        return missing

    def apply(self, event: Event) -> BatchView | None:
        """Fold the next event (in seq order); returns the parsed batch of a batch_trained."""
        self.last_seq = event.seq
        self.head_hash = event.hash
        kind = event.kind
        batch = None
        if kind == EventKind.BATCH_TRAINED:
            batch = parse_batch(event)
            self._apply_batch(event.seq, batch)
        elif kind == EventKind.WEIGHT_COMMITTED and event.version is not None:
            self.head_version = max(self.head_version, event.version)
        elif kind == EventKind.CELL_PROMOTED and event.cell_id and event.epoch is not None:
            self.epoch = max(self.epoch, event.epoch)
            self.publisher_cell = event.cell_id
            self.promotions += 1
        elif kind == EventKind.RUN_RESUMED:
            self.resumes += 1
            self.prompts.apply_resume(event)
        elif kind == EventKind.ENGINES_STAMPED:
            self._stamp(event)
        elif kind == EventKind.CHECKPOINT_SAVED:
            self.checkpoints += 1
            self.last_checkpoint = {"seq": event.seq, "payload": event.payload}
        elif kind == EventKind.RUN_FINISHED:
            self.outcome = "finished"
        elif kind == EventKind.RUN_FAILED:
            self.outcome = "failed"
        return batch

    def _stamp(self, event: Event) -> None:
        version = event.payload.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            return  # malformed: verify names it
        self.stamped.add(version, version, True)
        nodes = event.payload.get("engine_nodes") or {}
        for engine_id in event.payload.get("engine_ids", []):
            known = self.engines.get(engine_id, [0, 0, None, None])
            node = nodes.get(engine_id) if isinstance(nodes, dict) else None
            if isinstance(node, dict):
                known[2:] = [node.get("node_id"), node.get("host")]
            self.engines[engine_id] = [version, event.seq, *known[2:]]

    def apply_batch_event(self, event: Event, batch: BatchView | None) -> None:
        """Fold a ``batch_trained`` already parsed by the caller (None: malformed)."""
        self.last_seq = event.seq
        self.head_hash = event.hash
        self._apply_batch(event.seq, batch)

    def _apply_batch(self, seq: int, batch: BatchView | None) -> None:
        if batch is None:
            self.malformed += 1
            return
        self.prompts.apply_batch(batch)
        if batch.train_step not in self.steps:
            self.steps.add(batch.train_step, batch.train_step, True)
            if batch.train_step == self.prompts.last_step:
                self.last_step_seq = seq

    def fold(self, events: Iterable[Event]) -> Progress:
        """Fold ``events`` (those after ``last_seq``, in order); returns self."""
        for event in events:
            self.apply(event)
        return self

    def to_json(self, state_format: int = STATE_FORMAT) -> dict[str, Any]:
        """The state as JSON (what a snapshot stores), in ``state_format`` (one of
        :data:`READABLE_FORMATS`)."""
        if state_format not in READABLE_FORMATS:
            raise ValueError(f"snapshot format {state_format!r}, not one of {READABLE_FORMATS}")
        progressions = state_format >= 3
        return {
            "format": state_format, "last_seq": self.last_seq, "head_hash": self.head_hash,
            "head_version": self.head_version, "epoch": self.epoch,
            "publisher_cell": self.publisher_cell,
            "prompts": self.prompts.to_json(progressions),
            "steps": self.steps.to_json(progressions), "last_step_seq": self.last_step_seq,
            "last_checkpoint": self.last_checkpoint, "checkpoints": self.checkpoints,
            "promotions": self.promotions, "resumes": self.resumes,
            "malformed": self.malformed, "outcome": self.outcome,
            "engines": {engine: list(view) for engine, view in sorted(self.engines.items())},
            "stamped": self.stamped.to_json(progressions),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        """The state :meth:`to_json` wrote.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a state (or another format).
        """
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(f"snapshot format {data.get('format')!r}, not one of "
                             f"{READABLE_FORMATS}")
        return cls(
            last_seq=int(data["last_seq"]), head_hash=str(data["head_hash"]),
            head_version=int(data["head_version"]), epoch=int(data["epoch"]),
            publisher_cell=data["publisher_cell"],
            prompts=PromptLedger.from_json(data["prompts"]),
            steps=IdMap.from_json(data["steps"]), last_step_seq=data["last_step_seq"],
            last_checkpoint=data["last_checkpoint"], checkpoints=int(data["checkpoints"]),
            promotions=int(data["promotions"]), resumes=int(data["resumes"]),
            malformed=int(data["malformed"]), outcome=data["outcome"],
            engines={str(engine): list(view) for engine, view in data["engines"].items()},
            stamped=IdMap.from_json(data["stamped"]),
        )


class ProgressSource(Protocol):
    """What :func:`load_progress` reads (a :class:`ledger.store.reads.Reader`)."""

    def latest_snapshot(self, run_id: str, max_seq: int) -> tuple[int, str, Any] | None:
        """(seq, head_hash, state) of the newest snapshot at or below ``max_seq``."""

    def event_hash_at(self, run_id: str, seq: int) -> str | None:
        """The stored hash of the event at ``seq`` (None: no such event)."""

    def events(self, run_id: str, start_seq: int = 1, end_seq: int | None = None
               ) -> Iterable[Event]:
        """The run's events in seq order."""

    def events_of_kind(self, run_id: str, kind: str, first_seq: int, last_seq: int
                       ) -> list[Event]:
        """The run's events of one kind in ``first_seq..last_seq``, in seq order."""


@dataclass(frozen=True)
class EngineStamps:
    """What ``ledger lag`` needs of a run's progress."""

    engines: dict[str, list[Any]]  # engine -> [stamped version, seq, node_id, host]
    unstamped_versions: list[int]


def trusted_snapshot(source: ProgressSource, run_id: str, head_seq: int) -> Progress | None:
    """The run's newest snapshot at or below ``head_seq``, if its hash is the chain's hash at
    its seq and its state reads back (else None: ``ledger verify`` names the bad one)."""
    found = source.latest_snapshot(run_id, head_seq)
    if found is None:
        return None
    seq, head_hash, state = found
    if source.event_hash_at(run_id, seq) != head_hash:
        return None
    try:
        progress = Progress.from_json(state)
    except (KeyError, TypeError, ValueError):
        return None
    if progress.last_seq != seq or progress.head_hash != head_hash:
        return None
    return progress


def load_progress(source: ProgressSource, run_id: str, head_seq: int) -> tuple[Progress, int]:
    """The run's progress at ``head_seq`` and the seq it was folded from (1: no usable
    snapshot): the trusted snapshot (:func:`trusted_snapshot`) and the events after it, or
    every event.

    Raises:
        LedgerError: an event row that cannot be decoded.
    """
    progress = trusted_snapshot(source, run_id, head_seq)
    if progress is None:
        return Progress().fold(source.events(run_id, 1, head_seq)), 1
    first = progress.last_seq + 1
    return progress.fold(source.events(run_id, first, head_seq)), first


def load_engine_stamps(source: ProgressSource, run_id: str, head_seq: int) -> EngineStamps:
    """Each engine's newest stamp and the versions never stamped, at ``head_seq``: what
    :func:`load_progress` gives, from the trusted snapshot and only the commits and stamps
    after it (the other three events of a step, and the batch parse, are not read).

    Raises:
        LedgerError: an event row that cannot be decoded.
    """
    progress = trusted_snapshot(source, run_id, head_seq) or Progress()
    first = progress.last_seq + 1
    for event in source.events_of_kind(run_id, EventKind.WEIGHT_COMMITTED.value, first,
                                       head_seq):
        progress.apply(event)  # the head version: a maximum, so order does not matter
    for event in source.events_of_kind(run_id, EventKind.ENGINES_STAMPED.value, first,
                                       head_seq):
        progress.apply(event)
    return EngineStamps(progress.engines, progress.unstamped_versions)
