"""verify(): replay a run and report every broken invariant of DESIGN section 4.

What the ledger alone can check: (1) gapless seq and an intact hash chain, (2) committed
versions 1..k in seq order, (3) epochs that only grow and publisher events carrying the epoch
current at their seq, (4) commits only after a promotion of their cell and never from a fenced
epoch, (5) engines stamped only with committed versions, and (6) the negative-staleness count a
run reports when it finishes. The head row must agree with the replay. A committed version that
no ``engines_stamped`` event names is not a problem: it is what a death between commit and stamp
leaves, and it is reported as a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ledger.errors import LedgerError
from ledger.events import GENESIS_HASH, PUBLISHER_KINDS, Event, EventKind, Head, event_hash
from ledger.projections import RunState

__all__ = ["AuditReport", "AuditSource", "Problem", "verify"]


class _NamedRun(Protocol):
    run_id: str


class AuditSource(Protocol):
    """What the audit reads: one consistent view of the ledger (``Ledger.snapshot()``)."""

    def runs(self) -> Sequence[_NamedRun]:
        """Every run, oldest first."""

    def head(self, run_id: str) -> Head:
        """The run's head row; raises UnknownRunError if it has none."""

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterable[Event]:
        """The run's events in seq order."""

_KNOWN_KINDS = {kind.value for kind in EventKind}
_PUBLISHER_KIND_VALUES = {kind.value for kind in PUBLISHER_KINDS}


@dataclass(frozen=True)
class Problem:
    """One broken invariant: where (run, seq), which check, and what is wrong."""

    run_id: str
    seq: int
    check: str
    message: str

    def __str__(self) -> str:
        return f"run {self.run_id} seq {self.seq}: {self.check}: {self.message}"


@dataclass
class AuditReport:
    """The result of :func:`verify`: problems (invariant violations) and notes (benign)."""

    run_ids: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unstamped: dict[str, list[int]] = field(default_factory=dict)
    events_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed-but-unstamped versions, over every audited run (one run: just its own)."""
        return sorted(v for versions in self.unstamped.values() for v in versions)


class _RunChecker:
    """Checks one run's events as they stream past, in seq order."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.state = RunState(run_id)
        self.problems: list[Problem] = []
        self.expected_seq = 1
        self.prev_hash = GENESIS_HASH
        self.promoted_cells: set[str] = set()

    def problem(self, seq: int, check: str, message: str) -> None:
        self.problems.append(Problem(self.run_id, seq, check, message))

    def check(self, event: Event) -> None:
        self._check_chain(event)
        if event.kind not in _KNOWN_KINDS:
            self.problem(event.seq, "unknown_kind", f"unknown event kind {event.kind!r}")
            return
        if event.seq == 1 and event.kind != EventKind.RUN_STARTED:
            self.problem(event.seq, EventKind.RUN_STARTED.value, f"first event is {event.kind}")
        if event.kind == EventKind.CELL_PROMOTED:
            self._check_promotion(event)
        if event.kind in _PUBLISHER_KIND_VALUES:
            self._check_publisher_event(event)
        if event.kind == EventKind.WEIGHT_COMMITTED:
            self._check_commit(event)
        elif event.version is not None:
            self.problem(event.seq, "version", f"{event.kind} carries version {event.version}")
        if event.kind == EventKind.ENGINES_STAMPED:
            self._check_stamp(event)
        if event.kind == EventKind.RUN_FINISHED:
            negative = event.payload.get("negative_staleness_total", 0)
            if negative:
                self.problem(
                    event.seq, "negative_staleness", f"{negative} negative staleness values"
                )
        self.state.apply(event)

    def _check_chain(self, event: Event) -> None:
        if event.seq != self.expected_seq:
            self.problem(
                event.seq, "seq_gap", f"expected seq {self.expected_seq}, found {event.seq}"
            )
        if event.prev_hash != self.prev_hash:
            self.problem(event.seq, "hash_chain", "prev_hash does not match the previous event")
        recomputed = event_hash(
            prev_hash=event.prev_hash, run_id=event.run_id, seq=event.seq, kind=event.kind,
            version=event.version, cell_id=event.cell_id, epoch=event.epoch,
            idempotency_key=event.idempotency_key, payload=event.payload,
            recorded_at=event.recorded_at,
        )
        if recomputed != event.hash:
            self.problem(
                event.seq, "hash_mismatch",
                "stored hash does not match the event's contents (tampered or corrupt)",
            )
        self.expected_seq = event.seq + 1
        self.prev_hash = event.hash

    def _check_promotion(self, event: Event) -> None:
        expected = self.state.epoch + 1
        if event.epoch != expected:
            self.problem(
                event.seq, "epoch_order",
                f"promotion of cell {event.cell_id} to epoch {event.epoch}; expected {expected}",
            )
        if event.cell_id:
            self.promoted_cells.add(event.cell_id)

    def _check_publisher_event(self, event: Event) -> None:
        if event.cell_id not in self.promoted_cells:
            self.problem(
                event.seq, "no_promotion",
                f"{event.kind} from cell {event.cell_id} that was never promoted",
            )
        elif event.epoch != self.state.epoch or event.cell_id != self.state.publisher_cell:
            self.problem(
                event.seq, "fenced_write",
                f"{event.kind} from cell {event.cell_id} epoch {event.epoch}; publisher is "
                f"cell {self.state.publisher_cell} epoch {self.state.epoch}",
            )

    def _check_commit(self, event: Event) -> None:
        expected = self.state.head_version + 1
        if event.version != expected:
            self.problem(
                event.seq, "version_order",
                f"committed version {event.version}; expected {expected}",
            )

    def _check_stamp(self, event: Event) -> None:
        version = event.payload.get("version")
        if version != 0 and version not in self.state.commits:
            self.problem(
                event.seq, "stamp_uncommitted",
                f"engines stamped with version {version}, which is not committed",
            )

    def check_head(self, source: AuditSource) -> None:
        head = source.head(self.run_id)
        derived = (
            self.state.last_seq, self.state.head_version, self.state.epoch,
            self.state.publisher_cell, self.state.head_hash,
        )
        stored = (head.seq, head.version, head.epoch, head.publisher_cell, head.hash)
        if derived != stored:
            self.problem(
                head.seq, "head_mismatch",
                f"head row says seq/version/epoch/publisher {stored[:4]}, "
                f"events say {derived[:4]}",
            )


def verify(source: AuditSource, run_id: str | None = None) -> AuditReport:
    """Audit one run (or every run) of ``source``. Reads only; never raises for a bad row.

    Raises:
        UnknownRunError: ``run_id`` is not in the ledger.
    """
    run_ids = [run_id] if run_id is not None else [r.run_id for r in source.runs()]
    if run_id is not None:
        source.head(run_id)  # raises UnknownRunError for a run that does not exist
    report = AuditReport(run_ids=run_ids)
    for rid in run_ids:
        checker = _RunChecker(rid)
        try:
            for event in source.events(rid):
                checker.check(event)
                report.events_checked += 1
        except LedgerError as exc:
            checker.problem(checker.expected_seq, "unreadable", str(exc))
        else:
            checker.check_head(source)
        report.problems.extend(checker.problems)
        if checker.state.unstamped_versions:
            report.unstamped[rid] = checker.state.unstamped_versions
    return report
