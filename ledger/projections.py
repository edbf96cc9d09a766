"""Fold a run's events into its current state: head, epochs, cells, engines, adapters, and
provenance (steps, versions trained on, prompts: :mod:`ledger.provenance`).

The fold trusts nothing it is not shown: it replays events in ``seq`` order and derives
everything else. :mod:`ledger.audit` compares what it derives with what the head row claims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger import payloads
from ledger.events import GENESIS_HASH, Event, EventKind
from ledger.provenance import BatchView, PromptLedger, Provenance

__all__ = [
    "AbortView",
    "CellView",
    "CommitView",
    "EngineView",
    "Promotion",
    "RunState",
    "fold",
]


@dataclass
class CellView:
    """What the ledger knows of one cell."""

    cell_id: str
    state: str = "unknown"
    epochs: list[int] = field(default_factory=list)
    last_seq: int = 0
    last_kind: str = ""
    last_recorded_at: datetime | None = None

    @property
    def promotions(self) -> int:
        return len(self.epochs)


@dataclass(frozen=True)
class CommitView:
    """One committed version."""

    version: int
    seq: int
    cell_id: str | None
    epoch: int | None
    train_step: int
    transport: str
    adapter: str | None
    checksum: str | None
    recorded_at: datetime


@dataclass
class EngineView:
    """The newest version an engine was stamped with, according to ``engines_stamped``."""

    engine_id: str
    stamped_version: int = 0
    last_seq: int = 0


@dataclass(frozen=True)
class Promotion:
    seq: int
    cell_id: str
    epoch: int
    reason: str
    recorded_at: datetime


@dataclass(frozen=True)
class AbortView:
    """One aborted weight update, with the head version current when it was recorded."""

    seq: int
    cell_id: str | None
    train_step: int
    reason: str
    head_version: int
    recorded_at: datetime


@dataclass
class RunState:
    """A run as of its last folded event."""

    run_id: str
    head_version: int = 0
    epoch: int = 0
    publisher_cell: str | None = None
    last_seq: int = 0
    head_hash: str = GENESIS_HASH
    started_at: datetime | None = None
    commits: dict[int, CommitView] = field(default_factory=dict)
    stamped_versions: set[int] = field(default_factory=set)
    stamps: dict[int, dict[str, int]] = field(default_factory=dict)  # version -> engine -> seq
    cells: dict[str, CellView] = field(default_factory=dict)
    engines: dict[str, EngineView] = field(default_factory=dict)
    promotions: list[Promotion] = field(default_factory=list)
    aborts: list[AbortView] = field(default_factory=list)
    checkpoints: list[Event] = field(default_factory=list)
    resumes: int = 0
    outcome: str | None = None  # "finished" or "failed" once a terminal event is folded
    failure_reason: str | None = None
    provenance: Provenance = field(default_factory=Provenance)
    config: dict[str, Any] = field(default_factory=dict)  # run_started's (dataset included)
    evals: list[Event] = field(default_factory=list)  # eval_finished, seq order

    @property
    def batches(self) -> dict[int, BatchView]:
        """Train step -> what it trained (its first ``batch_trained`` event)."""
        return self.provenance.batches

    @property
    def trained_on(self) -> dict[int, dict[int, int]]:
        """Version -> {train step: samples generated under that version it trained}."""
        return self.provenance.trained_on

    @property
    def prompts(self) -> PromptLedger:
        """The run's prompt account (issued, trained, dropped, recycled, in flight)."""
        return self.provenance.prompts

    @property
    def adapters(self) -> dict[int, str]:
        """Version -> LoRA adapter name, for versions committed through the LoRA transport."""
        return {v: c.adapter for v, c in self.commits.items() if c.adapter is not None}

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed versions no ``engines_stamped`` event names (a death after commit)."""
        return sorted(set(self.commits) - self.stamped_versions)

    def apply(self, event: Event) -> None:
        """Advance the state by one event (the next in ``seq`` order).

        Raises:
            PayloadError: a payload this fold reads lacks a field its model requires (a row
                written around the append's validation; ``ledger verify`` names it).
        """
        self.last_seq = event.seq
        self.head_hash = event.hash
        if event.cell_id is not None:
            cell = self.cells.setdefault(event.cell_id, CellView(event.cell_id))
            cell.last_seq = event.seq
            cell.last_kind = event.kind
            cell.last_recorded_at = event.recorded_at
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, event)

    def _started(self, event: Event) -> None:
        self.started_at = event.recorded_at
        self.config = dict(event.payload_as(payloads.RunStarted).config)

    def _resumed(self, event: Event) -> None:
        self.resumes += 1
        self.provenance.apply(event)

    def _batch(self, event: Event) -> None:
        self.provenance.apply(event)

    def _cell_state(self, event: Event) -> None:
        if event.cell_id:
            self.cells[event.cell_id].state = event.payload_as(payloads.CellState).state

    def _committed(self, event: Event) -> None:
        if event.version is None:
            return  # verify names a commit without a version
        commit = event.payload_as(payloads.WeightCommitted)
        self.head_version = max(self.head_version, event.version)
        self.commits[event.version] = CommitView(
            version=event.version, seq=event.seq, cell_id=event.cell_id, epoch=event.epoch,
            train_step=commit.train_step, transport=commit.transport, adapter=commit.adapter,
            checksum=commit.checksum, recorded_at=event.recorded_at,
        )

    def _aborted(self, event: Event) -> None:
        abort = event.payload_as(payloads.WeightUpdateAborted)
        self.aborts.append(AbortView(
            seq=event.seq, cell_id=event.cell_id, train_step=abort.train_step,
            reason=abort.reason, head_version=self.head_version,
            recorded_at=event.recorded_at,
        ))

    def _stamped(self, event: Event) -> None:
        stamp = event.payload_as(payloads.EnginesStamped)
        self.stamped_versions.add(stamp.version)
        stamped = self.stamps.setdefault(stamp.version, {})
        for engine_id in stamp.engine_ids:
            stamped.setdefault(engine_id, event.seq)
            engine = self.engines.setdefault(engine_id, EngineView(engine_id))
            engine.stamped_version = stamp.version
            engine.last_seq = event.seq

    def _checkpoint(self, event: Event) -> None:
        self.checkpoints.append(event)

    def _eval(self, event: Event) -> None:
        self.evals.append(event)

    def _finished(self, event: Event) -> None:
        self.outcome = "finished"

    def _failed(self, event: Event) -> None:
        self.outcome = "failed"
        self.failure_reason = event.payload_as(payloads.RunFailed).reason

    def _promote(self, event: Event) -> None:
        if not event.cell_id or event.epoch is None:
            return  # verify names a promotion without a cell or epoch
        promotion = event.payload_as(payloads.CellPromoted)
        previous = self.publisher_cell
        if previous is not None and previous != event.cell_id and previous in self.cells:
            if self.cells[previous].state == "publisher":
                self.cells[previous].state = "follower"
        self.epoch = max(self.epoch, event.epoch)
        self.publisher_cell = event.cell_id
        cell = self.cells[event.cell_id]
        cell.epochs.append(event.epoch)
        cell.state = "publisher"
        self.promotions.append(Promotion(
            seq=event.seq, cell_id=event.cell_id, epoch=event.epoch,
            reason=promotion.reason, recorded_at=event.recorded_at,
        ))


# Kind -> how it advances the state; kinds not here (drill events) only move the head.
_HANDLERS: dict[EventKind, Callable[[RunState, Event], None]] = {
    EventKind.RUN_STARTED: RunState._started,
    EventKind.RUN_RESUMED: RunState._resumed,
    EventKind.BATCH_TRAINED: RunState._batch,
    EventKind.CELL_PROMOTED: RunState._promote,
    EventKind.CELL_STATE: RunState._cell_state,
    EventKind.WEIGHT_COMMITTED: RunState._committed,
    EventKind.WEIGHT_UPDATE_ABORTED: RunState._aborted,
    EventKind.ENGINES_STAMPED: RunState._stamped,
    EventKind.CHECKPOINT_SAVED: RunState._checkpoint,
    EventKind.EVAL_FINISHED: RunState._eval,
    EventKind.RUN_FINISHED: RunState._finished,
    EventKind.RUN_FAILED: RunState._failed,
}


def fold(run_id: str, events: Iterable[Event]) -> RunState:
    """Replay ``events`` (in seq order) into a :class:`RunState`."""
    state = RunState(run_id)
    for event in events:
        state.apply(event)
    return state
