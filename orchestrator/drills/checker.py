"""The drill checker: a run's recorded history judged after a drill.

Like Jepsen's checkers, it reads only what was recorded: the run's ledger events and the run's
own final counters (the ``run_finished`` payload the driver writes from the rollout manager's
metrics). It never asks a live process, so a verdict can be recomputed later from the database
alone.

The ledger invariants (DESIGN section 4, 1-5: gapless seq and hash chain, versions 1..k in seq
order, epochs that only grow, commits only from the promoted cell at its epoch, stamps only of
committed versions, the head row agreeing with the replay) are :meth:`ledger.Ledger.verify`'s
job; the checker reports its problems as they are and adds only what a drill needs on top:

* the run finished (a ``run_finished`` event; a ``run_failed`` one is reported with its reason);
* zero negative staleness (6) and zero prompts unaccounted (7), from the run's own counters;
* the read model every expectation uses (:class:`DrillRunState`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ledger import Event, EventKind, Ledger, RunState
from ledger.payloads import CellState, RunFinished
from ledger.projections import CommitView

__all__ = [
    "CheckReport",
    "DrillRunState",
    "check_run",
    "first_commit_after",
    "first_recovery_commit",
    "read_run",
    "seconds_between",
]


@dataclass
class DrillRunState(RunState):
    """:class:`ledger.RunState` plus the three facts a drill's verdict needs that the ledger's
    read model does not fold: the ``run_finished`` event, the ``run_resumed`` events, and which
    cells were healed at which seq."""

    finished: Event | None = None
    resumed: list[Event] = field(default_factory=list)
    healed: list[tuple[int, str]] = field(default_factory=list)  # (seq, cell_id)

    def apply(self, event: Event) -> None:
        """Advance by one event (see :meth:`ledger.RunState.apply`), keeping the drill facts."""
        super().apply(event)
        if event.kind == EventKind.RUN_FINISHED:
            self.finished = event
        elif event.kind == EventKind.RUN_RESUMED:
            self.resumed.append(event)
        elif (event.kind == EventKind.CELL_STATE and event.cell_id is not None
              and event.payload_as(CellState).state == "healed"):
            self.healed.append((event.seq, event.cell_id))

    def healed_since(self, seq: int) -> set[str]:
        """Cells healed at or after ``seq``."""
        return {cell_id for healed_seq, cell_id in self.healed if healed_seq >= seq}

    def promotions_since(self, seq: int) -> int:
        """Promotions recorded at or after ``seq``."""
        return sum(1 for promotion in self.promotions if promotion.seq >= seq)


def read_run(ledger: Ledger, run_id: str) -> DrillRunState:
    """Fold every event of ``run_id`` into a :class:`DrillRunState`.

    Raises:
        LedgerError: the ledger cannot be read (after its read retries).
    """
    state = DrillRunState(run_id)
    for event in ledger.events(run_id):
        state.apply(event)
    return state


def first_commit_after(state: RunState, seq: int) -> CommitView | None:
    """The first committed version recorded after ``seq``, or None."""
    later = [commit for commit in state.commits.values() if commit.seq > seq]
    return min(later, key=lambda commit: commit.seq, default=None)


def first_recovery_commit(state: RunState, seq_at_fault: int) -> CommitView | None:
    """The first version the recovery committed: after the fault, and, when a cell was promoted
    after it, at an epoch above the one current at the fault.

    A commit of the old epoch after ``seq_at_fault`` is legal (a publisher that outlived a
    killed driver may finish the update it was in before the next promotion fences it), but
    the recovery did not make it, so a recovery time must not be measured to it.
    """
    epoch_at_fault = max((p.epoch for p in state.promotions if p.seq <= seq_at_fault), default=0)
    promoted_since = any(p.seq > seq_at_fault for p in state.promotions)
    later = [commit for commit in state.commits.values() if commit.seq > seq_at_fault
             and (not promoted_since or (commit.epoch or 0) > epoch_at_fault)]
    return min(later, key=lambda commit: commit.seq, default=None)


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds (both naive UTC, or both aware)."""
    return (end - start).total_seconds()


@dataclass
class CheckReport:
    """What the checker found: ``problems`` (each one fails the drill), the folded run, and
    the numbers the verdict table shows."""

    state: DrillRunState
    problems: list[str] = field(default_factory=list)
    negative_staleness: int | None = None
    prompts_unaccounted: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def finished(self) -> bool:
        return self.state.finished is not None

    @property
    def head_version(self) -> int:
        return self.state.head_version

    @property
    def unstamped_versions(self) -> list[int]:
        return self.state.unstamped_versions

    @property
    def promotions(self) -> int:
        return len(self.state.promotions)


def check_run(ledger: Ledger, run_id: str, *, expect_finished: bool = True) -> CheckReport:
    """Audit ``run_id`` with :meth:`ledger.Ledger.verify` and add the drill-only checks.

    Precondition: the run exists in ``ledger``. Reads only; safe while the run is live (the
    report then describes a prefix of the history).

    Raises:
        LedgerError: the ledger cannot be read (after its read retries).
    """
    audit = ledger.verify(run_id)
    report = CheckReport(state=read_run(ledger, run_id))
    report.problems.extend(f"audit: {p.check} at seq {p.seq}: {p.message}"
                           for p in audit.problems)
    finished = report.state.finished
    if finished is None:
        if report.state.outcome == "failed":
            report.problems.append(f"the run failed: {report.state.failure_reason}")
        elif expect_finished:
            report.problems.append("the run did not finish (no run_finished event)")
        return report
    report.negative_staleness = finished.payload_as(RunFinished).negative_staleness_total
    report.prompts_unaccounted = int(finished.payload.get("prompts_unaccounted", 0))
    # The audit flags a negative count too; this line gives the drill's figure in its words.
    if report.negative_staleness:
        report.problems.append(f"negative staleness counted {report.negative_staleness} times")
    if report.prompts_unaccounted:
        report.problems.append(f"{report.prompts_unaccounted} prompts unaccounted for")
    return report
