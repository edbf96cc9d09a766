"""THE weight-update sequence (actors/publishing/sequence.py): its steps in order, its named
fault points, and what a failure at each point leaves behind.

In-process parts: a real TrainCell and a real RolloutEngine (plain objects, no Ray), a real
file-backed SQLite ledger. Fault schedule (declared up front; each test checks it fired):
- ``raise at UpdatePoint.AFTER_STAGE``: the update fails before anything is loaded
- ``raise at UpdatePoint.AFTER_COMMIT``: committed, never stamped
- in flight, ``raise at UpdatePoint.AFTER_TRANSFER``: staged in the engine, nothing committed
- in flight, ``raise at UpdatePoint.AFTER_COMMIT``: committed, never swapped in
"""

from __future__ import annotations

import pytest

from actors.errors import InjectedFault
from actors.publishing.sequence import FaultAction, UpdateFaults, UpdatePoint
from actors.transport import WeightSwap
from ledger import EventKind, FencedError
from tests.actors.publishing_fixtures import RUN, TASK, event_kinds


class _Recorder(UpdateFaults):
    """Records every point the sequence passes (and still fires what is armed)."""

    def __init__(self) -> None:
        super().__init__()
        self.passed: list[UpdatePoint] = []

    def __call__(self, point: UpdatePoint) -> None:
        self.passed.append(point)
        super().__call__(point)


def test_the_sequence_passes_every_point_in_order_and_reports_the_committed_head(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    recorder = _Recorder()
    cell._faults = recorder

    report = cell.update_weights([engine], epoch)

    commit = next(e for e in ledger.events(RUN) if e.kind == EventKind.WEIGHT_COMMITTED)
    assert recorder.passed == list(UpdatePoint)
    assert (report.committed.version, report.committed.epoch) == (1, epoch)
    assert (report.committed.seq, report.committed.hash) == (commit.seq, commit.hash)
    assert report.committed.publisher_cell == "cell-0"
    assert event_kinds(ledger)[-3:] == [EventKind.WEIGHT_UPDATE_STARTED,
                                        EventKind.WEIGHT_COMMITTED, EventKind.ENGINES_STAMPED]
    assert engine.health()["version"] == 1 and not engine.health()["paused"]
    assert engine.weights_checksum() == cell.weights_checksum() == report.checksum
    assert set(report.step_seconds) == {"started", "stage", "pause", "load", "commit",
                                        "stamp", "stamped"}


def test_a_failure_before_the_load_records_an_abort_and_commits_nothing(publishing) -> None:
    ledger, epoch, cell, engine = publishing
    initial = engine.weights_checksum()
    cell.arm_update_fault(UpdatePoint.AFTER_STAGE, FaultAction.RAISE)

    with pytest.raises(InjectedFault):
        cell.update_weights([engine], epoch)

    assert cell._faults.fired == [UpdatePoint.AFTER_STAGE]
    assert ledger.head(RUN).version == 0
    assert EventKind.WEIGHT_UPDATE_ABORTED in event_kinds(ledger)
    assert EventKind.WEIGHT_COMMITTED not in event_kinds(ledger)
    assert engine.weights_checksum() == initial  # nothing loaded
    assert cell.update_weights([engine], epoch).version == 1  # the retry publishes
    assert ledger.verify(RUN).ok


def test_a_fenced_publisher_never_pauses_an_engine(publishing) -> None:
    """The pause is sent only after step 1 is recorded, so a superseded cell leaves the
    engines serving and records nothing."""
    ledger, epoch, cell, engine = publishing
    newer = ledger.promote(RUN, "cell-1", reason="failover")
    events_before = len(event_kinds(ledger))

    with pytest.raises(FencedError):
        cell.update_weights([engine], epoch)

    health = engine.health()
    assert (health["paused"], health["epoch"]) == (False, 0)  # never asked to pause
    assert len(event_kinds(ledger)) == events_before  # nothing recorded
    assert ledger.head(RUN).epoch == newer


def test_in_flight_a_fenced_publisher_stages_nothing_in_an_engine(publishing) -> None:
    """In flight there is no pause to withhold: a fenced step 1 still ends the update before
    anything is staged in an engine."""
    ledger, epoch, cell, engine = publishing
    ledger.promote(RUN, "cell-1", reason="failover")
    initial = engine.weights_checksum()
    events_before = len(event_kinds(ledger))

    with pytest.raises(FencedError):
        cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT)

    health = engine.health()
    assert (health["paused"], health["version"], health["weight_stages"]) == (False, 0, 0)
    assert engine.weights_checksum() == initial
    assert len(event_kinds(ledger)) == events_before


def test_a_failure_after_the_commit_leaves_an_unstamped_version_and_the_next_is_head_plus_one(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    cell.arm_update_fault(UpdatePoint.AFTER_COMMIT, FaultAction.RAISE)

    with pytest.raises(InjectedFault):
        cell.update_weights([engine], epoch)

    assert cell._faults.fired == [UpdatePoint.AFTER_COMMIT]
    assert ledger.head(RUN).version == 1
    assert engine.health()["version"] == 0 and engine.health()["paused"]
    assert ledger.verify(RUN).unstamped_versions == [1]
    cell.train_step_count += 1  # the next step's update (new idempotency keys)
    assert cell.update_weights([engine], epoch).version == 2
    assert engine.health()["version"] == 2


# ------------------------------------------------------------------------------ in flight


def test_in_flight_the_engine_never_pauses_before_the_commit_and_swaps_at_the_stamp(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    recorder = _Recorder()
    seen: dict[UpdatePoint, tuple[bool, int, str]] = {}

    def observe(point: UpdatePoint) -> None:
        recorder(point)
        health = engine.health()
        seen[point] = (health["paused"], health["version"], engine.weights_checksum())

    cell._faults = observe  # type: ignore[assignment]
    initial = engine.weights_checksum()

    report = cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT)

    assert recorder.passed == [p for p in UpdatePoint if p is not UpdatePoint.AFTER_PAUSE]
    before_swap = [p for p in recorder.passed if p is not UpdatePoint.AFTER_FINALIZE]
    assert all(seen[p] == (False, 0, initial) for p in before_swap)  # serving, old weights
    assert seen[UpdatePoint.AFTER_FINALIZE] == (False, 1, cell.weights_checksum())
    assert report.checksum == cell.weights_checksum()
    assert set(report.step_seconds) == {"started", "stage", "load", "commit", "stamp",
                                        "stamped"}
    health = engine.health()
    assert (health["weight_stages"], health["weight_swaps"], health["weight_loads"]) == (1, 1, 1)
    assert event_kinds(ledger)[-3:] == [EventKind.WEIGHT_UPDATE_STARTED,
                                        EventKind.WEIGHT_COMMITTED, EventKind.ENGINES_STAMPED]
    assert ledger.verify(RUN).ok


def test_in_flight_a_failure_before_the_commit_leaves_the_engine_serving_its_old_weights(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    initial = engine.weights_checksum()
    cell.arm_update_fault(UpdatePoint.AFTER_TRANSFER, FaultAction.RAISE)

    with pytest.raises(InjectedFault):
        cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT)

    health = engine.health()
    assert (health["paused"], health["version"], health["weight_stages"]) == (False, 0, 1)
    assert engine.weights_checksum() == initial
    assert all(s.weight_versions == [0] for s in engine.generate(TASK.make_prompt(1), 2, 1))
    assert EventKind.WEIGHT_UPDATE_ABORTED in event_kinds(ledger)
    assert ledger.head(RUN).version == 0
    assert cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT).version == 1
    assert engine.weights_checksum() == cell.weights_checksum()


def test_in_flight_a_failure_after_the_commit_leaves_the_version_unstamped_and_serving_old(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    initial = engine.weights_checksum()
    cell.arm_update_fault(UpdatePoint.AFTER_COMMIT, FaultAction.RAISE)

    with pytest.raises(InjectedFault):
        cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT)

    health = engine.health()
    assert ledger.head(RUN).version == 1
    assert (health["paused"], health["version"]) == (False, 0)  # never paused, label true
    assert engine.weights_checksum() == initial
    assert ledger.verify(RUN).unstamped_versions == [1]
    cell.train_step_count += 1
    assert cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT).version == 2
    assert engine.health()["version"] == 2
    assert engine.weights_checksum() == cell.weights_checksum()


def test_an_armed_point_fires_once_and_unknown_points_are_refused() -> None:
    faults = UpdateFaults()
    faults.arm("after-commit", "raise")

    with pytest.raises(InjectedFault):
        faults(UpdatePoint.AFTER_COMMIT)
    faults(UpdatePoint.AFTER_COMMIT)  # disarmed: nothing happens

    assert faults.fired == [UpdatePoint.AFTER_COMMIT] and faults.armed() == {}
    with pytest.raises(ValueError):
        faults.arm("after-lunch")
