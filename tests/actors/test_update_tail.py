"""Steps 5-6 of a weight update on the cell's update tail (actors/publishing/tail.py): the
update returns once committed, the cell trains on while the engines take the stamp, and the
tail is settled before the next update, with its failures meaning what they meant before.

In-process parts: a real TrainCell and a real RolloutEngine (plain objects, no Ray), a real
file-backed SQLite ledger. The tail is held at ``UpdatePoint.AFTER_FINALIZE`` (engines
stamped, ``engines_stamped`` not recorded) by an ``at_point`` that waits on an event, so each
test sees the tail running, not a race.
"""

from __future__ import annotations

import threading

import pytest

from actors.errors import InjectedFault
from actors.publishing.sequence import FaultAction, UpdateFaults, UpdatePoint
from actors.publishing.tail import TailOutcome, UpdateTail
from actors.transport import WeightSwap
from ledger import EventKind
from tests.actors.publishing_fixtures import RUN, batch, event_kinds

WAIT_S = 30.0


class _HeldAfterFinalize(UpdateFaults):
    """Holds the tail at AFTER_FINALIZE until released (and still fires what is armed)."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, point: UpdatePoint) -> None:
        if point is UpdatePoint.AFTER_FINALIZE:
            self.reached.set()
            assert self.release.wait(WAIT_S), "the test never released the tail"
        super().__call__(point)


@pytest.mark.parametrize("swap", [WeightSwap.PAUSE, WeightSwap.IN_FLIGHT])
def test_the_update_returns_once_committed_and_the_cell_trains_while_the_tail_runs(
        publishing, swap: WeightSwap) -> None:
    ledger, epoch, cell, engine = publishing
    held = cell._faults = _HeldAfterFinalize()

    report = cell.update_weights([engine], epoch, swap=swap, finish_in_background=True)

    assert report.finishing and report.version == 1 == ledger.head(RUN).version
    assert report.stamped_engine_ids == [] and "stamp" not in report.step_seconds
    assert held.reached.wait(WAIT_S)  # step 5 ran on the tail: the engine holds v1
    assert engine.health()["version"] == 1
    assert EventKind.ENGINES_STAMPED not in event_kinds(ledger)  # step 6 is held
    trained = cell.train_step(batch(engine))  # the cell is free meanwhile
    assert cell.train_step_count == 2 and "loss" in trained

    held.release.set()
    outcome = cell.settle_update(WAIT_S)

    assert isinstance(outcome, TailOutcome)
    assert (outcome.version, outcome.stamped_engine_ids, outcome.failed) == (1, ["engine-0"], {})
    assert {"stamp", "stamped", "tail_wait"} <= set(outcome.step_seconds)
    assert event_kinds(ledger)[-1] == EventKind.ENGINES_STAMPED
    report = ledger.verify(RUN)
    assert report.ok and report.unstamped_versions == []
    assert cell.settle_update() is None  # nothing pending any more


def test_the_next_update_settles_the_tail_first_so_its_events_stay_in_order(publishing) -> None:
    ledger, epoch, cell, engine = publishing
    held = cell._faults = _HeldAfterFinalize()
    cell.update_weights([engine], epoch, finish_in_background=True)
    cell.train_step(batch(engine))
    threading.Timer(0.3, held.release.set).start()  # released while the next update waits

    second = cell.update_weights([engine], epoch, finish_in_background=True)
    cell.settle_update(WAIT_S)

    assert second.version == 2 and second.step_seconds["tail_wait"] >= 0.2
    kinds = [(event.kind, event.payload.get("version")) for event in ledger.events(RUN)
             if event.kind in (EventKind.WEIGHT_UPDATE_STARTED, EventKind.WEIGHT_COMMITTED,
                               EventKind.ENGINES_STAMPED)]
    assert [kind for kind, _ in kinds] == [
        EventKind.WEIGHT_UPDATE_STARTED, EventKind.WEIGHT_COMMITTED, EventKind.ENGINES_STAMPED,
    ] * 2
    stamped = [event for event in ledger.events(RUN) if event.kind == EventKind.ENGINES_STAMPED]
    assert [event.payload["version"] for event in stamped] == [1, 2]
    assert engine.health()["version"] == 2
    assert engine.weights_checksum() == cell.weights_checksum()
    assert ledger.verify(RUN).ok


def test_a_failed_tail_is_raised_by_the_next_update_and_leaves_its_version_unstamped(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    cell.arm_update_fault(UpdatePoint.AFTER_FINALIZE, FaultAction.RAISE)
    cell.update_weights([engine], epoch, finish_in_background=True)
    cell.train_step(batch(engine))

    with pytest.raises(InjectedFault):
        cell.update_weights([engine], epoch, finish_in_background=True)

    assert ledger.head(RUN).version == 1  # the failed settle started nothing new
    assert ledger.verify(RUN).unstamped_versions == [1]
    assert cell.update_weights([engine], epoch, finish_in_background=True).version == 2
    assert cell.settle_update(WAIT_S) is not None
    assert ledger.verify(RUN).unstamped_versions == [1]  # v2 was stamped


def test_a_tail_that_finds_its_cell_superseded_is_dropped_and_records_nothing(
        publishing) -> None:
    ledger, epoch, cell, engine = publishing
    held = cell._faults = _HeldAfterFinalize()
    cell.update_weights([engine], epoch, finish_in_background=True)
    assert held.reached.wait(WAIT_S)
    ledger.promote(RUN, "cell-1", reason="failover")  # engines_stamped is now fenced
    events_before = len(event_kinds(ledger))

    held.release.set()

    assert cell.settle_update(WAIT_S) is None
    assert len(event_kinds(ledger)) == events_before
    assert ledger.verify(RUN).unstamped_versions == [1]


def test_a_checkpoint_waits_for_the_tail_so_engines_stamped_comes_first(publishing,
                                                                         tmp_path) -> None:
    ledger, epoch, cell, engine = publishing
    held = cell._faults = _HeldAfterFinalize()
    cell.update_weights([engine], epoch, finish_in_background=True)
    threading.Timer(0.3, held.release.set).start()

    cell.save_checkpoint(str(tmp_path / "step-1.pt"), epoch)

    kinds = event_kinds(ledger)
    assert kinds[-2:] == [EventKind.ENGINES_STAMPED, EventKind.CHECKPOINT_SAVED]


# ------------------------------------------------------------------------------ UpdateTail


def test_a_tail_must_be_settled_before_the_next_one_starts() -> None:
    tail = UpdateTail()
    gate = threading.Event()
    tail.start(1, lambda: (gate.wait(WAIT_S), TailOutcome(1))[1])

    with pytest.raises(RuntimeError, match="v1 is not settled"):
        tail.start(2, lambda: TailOutcome(2))
    with pytest.raises(TimeoutError):
        tail.settle(0.05)
    assert tail.pending  # a timed-out settle leaves it pending

    gate.set()
    assert tail.settle(WAIT_S).version == 1
    assert not tail.pending and tail.settle() is None


def test_a_tail_error_is_raised_once_by_the_settle_that_finds_it() -> None:
    tail = UpdateTail()
    tail.start(3, lambda: (_ for _ in ()).throw(OSError("disk full")))

    with pytest.raises(OSError, match="disk full"):
        tail.settle(WAIT_S)
    assert tail.settle() is None
    tail.start(4, lambda: TailOutcome(4, ["engine-0"]))
    assert tail.settle(WAIT_S).stamped_engine_ids == ["engine-0"]
