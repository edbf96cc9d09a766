"""Fold a run's events into its current state: head, epochs, cells, engines, adapters, and
provenance (steps, versions trained on, prompts: :mod:`ledger.provenance`).

The fold trusts nothing it is not shown: it replays events in ``seq`` order and derives
everything else. :mod:`ledger.audit` compares what it derives with what the head row claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
    def aborted_updates(self) -> int:
        """How many weight updates were aborted."""
        return len(self.aborts)

    @property
    def adapters(self) -> dict[int, str]:
        """Version -> LoRA adapter name, for versions committed through the LoRA transport."""
        return {v: c.adapter for v, c in self.commits.items() if c.adapter is not None}

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed versions no ``engines_stamped`` event names (a death after commit)."""
        return sorted(set(self.commits) - self.stamped_versions)

    def apply(self, event: Event) -> None:
        """Advance the state by one event (the next in ``seq`` order)."""
        self.last_seq = event.seq
        self.head_hash = event.hash
        if event.cell_id is not None:
            cell = self.cells.setdefault(event.cell_id, CellView(event.cell_id))
            cell.last_seq = event.seq
            cell.last_kind = event.kind
            cell.last_recorded_at = event.recorded_at
        kind = event.kind
        if kind == EventKind.RUN_STARTED:
            self.started_at = event.recorded_at
            config = event.payload.get("config")
            self.config = config if isinstance(config, dict) else {}
        elif kind == EventKind.RUN_RESUMED:
            self.resumes += 1
            self.provenance.apply(event)
        elif kind == EventKind.BATCH_TRAINED:
            self.provenance.apply(event)
        elif kind == EventKind.CELL_PROMOTED and event.cell_id and event.epoch is not None:
            self._promote(event)
        elif kind == EventKind.CELL_STATE and event.cell_id:
            self.cells[event.cell_id].state = event.payload.get("state", "unknown")
        elif kind == EventKind.WEIGHT_COMMITTED and event.version is not None:
            self.head_version = max(self.head_version, event.version)
            self.commits[event.version] = CommitView(
                version=event.version,
                seq=event.seq,
                cell_id=event.cell_id,
                epoch=event.epoch,
                train_step=int(event.payload.get("train_step", 0)),
                transport=str(event.payload.get("transport", "")),
                adapter=event.payload.get("adapter"),
                checksum=event.payload.get("checksum"),
                recorded_at=event.recorded_at,
            )
        elif kind == EventKind.WEIGHT_UPDATE_ABORTED:
            self.aborts.append(
                AbortView(
                    seq=event.seq,
                    cell_id=event.cell_id,
                    train_step=int(event.payload.get("train_step", 0)),
                    reason=str(event.payload.get("reason", "")),
                    head_version=self.head_version,
                    recorded_at=event.recorded_at,
                )
            )
        elif kind == EventKind.ENGINES_STAMPED:
            version = int(event.payload.get("version", 0))
            self.stamped_versions.add(version)
            stamped = self.stamps.setdefault(version, {})
            for engine_id in event.payload.get("engine_ids", []):
                stamped.setdefault(engine_id, event.seq)
                engine = self.engines.setdefault(engine_id, EngineView(engine_id))
                engine.stamped_version = version
                engine.last_seq = event.seq
        elif kind == EventKind.CHECKPOINT_SAVED:
            self.checkpoints.append(event)
        elif kind == EventKind.EVAL_FINISHED:
            self.evals.append(event)
        elif kind == EventKind.RUN_FINISHED:
            self.outcome = "finished"
        elif kind == EventKind.RUN_FAILED:
            self.outcome = "failed"
            self.failure_reason = str(event.payload.get("reason", ""))

    def _promote(self, event: Event) -> None:
        assert event.cell_id is not None and event.epoch is not None
        previous = self.publisher_cell
        if previous is not None and previous != event.cell_id and previous in self.cells:
            if self.cells[previous].state == "publisher":
                self.cells[previous].state = "follower"
        self.epoch = max(self.epoch, event.epoch)
        self.publisher_cell = event.cell_id
        cell = self.cells[event.cell_id]
        cell.epochs.append(event.epoch)
        cell.state = "publisher"
        self.promotions.append(
            Promotion(
                seq=event.seq,
                cell_id=event.cell_id,
                epoch=event.epoch,
                reason=str(event.payload.get("reason", "")),
                recorded_at=event.recorded_at,
            )
        )


def fold(run_id: str, events: Iterable[Event]) -> RunState:
    """Replay ``events`` (in seq order) into a :class:`RunState`."""
    state = RunState(run_id)
    for event in events:
        state.apply(event)
    return state
