"""Recovery figures of a campaign from its ledger: measured from each fault's firing to the
first commit its recovery made, and the faults that fired inside another's recovery.

Histories are written through the real ledger on a SQLite file, as a campaign writes them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ledger import EventKind, Ledger
from orchestrator.chaos import FaultKind
from orchestrator.chaos.recovery import fired_faults, percentile

RUN = "recovery"


def _fire(ledger: Ledger, index: int, kind: FaultKind) -> None:
    fired_at = datetime.now(UTC).replace(tzinfo=None).isoformat()
    ledger.append(RUN, EventKind.FAULT_INJECTED, {
        "fault": {"index": index, "kind": kind.value, "step": index + 2},
        "scenario": kind.value, "point": "between-steps", "fired_at": fired_at})


def test_a_late_commit_of_the_old_epoch_is_not_the_recovery_and_overlaps_are_marked(
        sqlite_url: str) -> None:
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run(RUN)
        epoch = ledger.promote(RUN, "cell-0", reason="start")
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        _fire(ledger, 0, FaultKind.KILL_DRIVER)
        # The crashed job's publisher finishes its update: legal, and not the recovery's.
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=2)
        _fire(ledger, 1, FaultKind.KILL_ENGINE)  # lands inside the resume's recovery
        resumed = ledger.promote(RUN, "cell-1", reason="resume")
        ledger.commit_weights(RUN, cell_id="cell-1", epoch=resumed, train_step=3)
        _fire(ledger, 2, FaultKind.KILL_FOLLOWER)  # nothing committed after it
        events = list(ledger.events(RUN))

    crash, engine, follower = fired_faults(events)

    assert (crash.kind, crash.recovered_by, crash.during_recovery_of) == (
        FaultKind.KILL_DRIVER, 3, None)
    assert (engine.recovered_by, engine.during_recovery_of) == (3, 0)
    assert crash.recovery_s is not None and crash.recovery_s >= engine.recovery_s >= 0
    assert follower.recovery_s is None and follower.recovered_by is None
    assert follower.during_recovery_of is None  # the others had recovered when it fired


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert percentile([5.0], 0.99) == 5.0
