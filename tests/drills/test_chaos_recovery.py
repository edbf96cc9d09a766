"""Recovery figures of a campaign from its ledger: measured from each fault's firing to the
first commit its recovery made, and the faults that fired inside another's recovery; and the
table that sums them up by kind.

Histories are written through the real ledger on a SQLite file, as a campaign writes them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ledger import EventKind, Ledger
from orchestrator.chaos import FaultKind
from orchestrator.chaos.campaign import CampaignOptions, CampaignResult
from orchestrator.chaos.history import HistoryVerdict
from orchestrator.chaos.nemesis import PlannedFault
from orchestrator.chaos.recovery import FiredFault, fired_faults, percentile
from orchestrator.render import ChaosTable

RUN = "recovery"


def _fire(ledger: Ledger, index: int, kind: FaultKind) -> None:
    fired_at = datetime.now(UTC).replace(tzinfo=None).isoformat()
    ledger.append(RUN, EventKind.FAULT_INJECTED, {
        "fault": {"index": index, "kind": kind.value, "step": index + 2},
        "scenario": kind.value, "point": "between-steps", "fired_at": fired_at})


def _replaced(ledger: Ledger, actor: str, actor_id: str, reason: str = "dead") -> None:
    ledger.append(RUN, EventKind.ACTOR_REPLACED,
                  {"actor": actor, "actor_id": actor_id, "reason": reason})


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
        _replaced(ledger, "engine", "engine-0")
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


def test_a_lost_actor_recovers_at_the_first_commit_after_its_replacement(
        sqlite_url: str) -> None:
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run(RUN)
        epoch = ledger.promote(RUN, "cell-0", reason="start")
        _fire(ledger, 0, FaultKind.FREEZE_ROLLOUT_MANAGER)
        # The step in progress had its batch: it commits without the manager.
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        _replaced(ledger, "rollout-manager", "rollout-manager", "frozen")
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=2)
        ledger.append(RUN, EventKind.FAULT_INJECTED, {
            "fault": {"index": 1, "kind": FaultKind.KILL_ENGINE.value, "step": 3},
            "scenario": "kill-engine", "point": "between-steps",
            "detail": {"engine": "engine-1"}})
        _replaced(ledger, "engine", "engine-0")  # another engine: not this fault's recovery
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=3)
        _fire(ledger, 2, FaultKind.KILL_ROLLOUT_MANAGER)  # never replaced
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=4)
        events = list(ledger.events(RUN))

    manager, engine, unreplaced = fired_faults(events)

    assert manager.recovered_by == 2 and manager.recovery_s > 0
    assert engine.recovered_by is None  # engine-1 was never replaced
    assert unreplaced.recovered_by is None and unreplaced.recovery_s is None


def test_the_campaign_table_counts_planned_chained_landed_and_recovered_by_kind(
        capsys) -> None:
    at = datetime(2026, 12, 2, 10, 0, 0)
    schedule = [PlannedFault(0, 4, FaultKind.KILL_DRIVER),
                PlannedFault(1, 4, FaultKind.DATABASE_OUTAGE, after=0),
                PlannedFault(2, 9, FaultKind.DATABASE_OUTAGE)]
    fired = [FiredFault(0, FaultKind.KILL_DRIVER, 4, "mid-drain", at, 10, 12.0, 5),
             FiredFault(1, FaultKind.DATABASE_OUTAGE, 4, "between-steps",
                        at + timedelta(seconds=10), 14, 2.0, 5, during_recovery_of=0),
             FiredFault(2, FaultKind.DATABASE_OUTAGE, 9, "between-steps",
                        at + timedelta(seconds=60), 30, None, None)]
    table = ChaosTable()
    left_out = "kill-node left out"
    for seed in (3, 4):
        table.add(CampaignResult(CampaignOptions(steps=20, seed=seed), f"chaos-s{seed}",
                                 "sqlite:///x.db", schedule if seed == 3 else [],
                                 fired if seed == 3 else [], HistoryVerdict(steps_trained=20),
                                 2, 95.0, notes=[left_out]))

    table.print()

    out = capsys.readouterr().out
    assert f"note (seeds 3, 4): {left_out}" in out  # which campaigns a note is about
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in out.splitlines()
            if line.startswith("│") and ("kill-" in line or "outage" in line)}
    # planned, planned in a recovery, fired, in a recovery, recovered, p50, p99
    assert rows["kill-driver"] == ["1", "0", "1", "0", "1", "12.00", "12.00"]
    assert rows["database-outage"] == ["2", "1", "2", "1", "1", "2.00", "2.00"]
