"""The drill checker on planted histories: a crashed job's late commit, a resume's recorded
head, and where a recovery time is measured to.

Histories are written through the public ledger API on a real SQLite file, as the job would
write them; nothing is run, so each case is exact.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ledger import EventKind, Ledger
from orchestrator.drills import SCENARIOS
from orchestrator.drills.checker import first_commit_after, first_recovery_commit, read_run
from orchestrator.drills.context import FaultRecord

RUN = "planted"


@pytest.fixture
def ledger(sqlite_url: str):
    with Ledger.open(sqlite_url) as opened:
        opened.start_run(RUN)
        yield opened


def _commit(ledger: Ledger, cell: str, epoch: int, step: int) -> int:
    return ledger.commit_weights(RUN, cell_id=cell, epoch=epoch, train_step=step)


def _crash_then_resume(ledger: Ledger, *, late_commits: int,
                       recorded_head: int | None = None) -> FaultRecord:
    """Two commits, the driver dies, ``late_commits`` more land from its surviving publisher,
    then the resume promotes, records ``run_resumed`` and commits twice."""
    epoch = ledger.promote(RUN, "cell-0", reason="start")
    for step in (1, 2):
        _commit(ledger, "cell-0", epoch, step)
    head = ledger.head(RUN)
    record = FaultRecord(fired=True, seq_at_fault=head.seq, version_before=head.version)
    for step in range(3, 3 + late_commits):
        _commit(ledger, "cell-0", epoch, step)
    resume_epoch = ledger.promote(RUN, "cell-0", reason="resume")
    head_at_promotion = ledger.head(RUN).version
    ledger.append(RUN, EventKind.RUN_RESUMED, {
        "checkpoint_step": 1, "checkpoint_version": 1,
        "head_version": head_at_promotion if recorded_head is None else recorded_head,
    })
    for step in (10, 11):
        _commit(ledger, "cell-0", resume_epoch, step)
    return record


def _crash_problems(ledger: Ledger, record: FaultRecord) -> list[str]:
    ctx = SimpleNamespace(record=record, ledger=ledger, run_id=RUN)
    return SCENARIOS["kill-driver"].expect(ctx, None, read_run(ledger, RUN))


def test_a_commit_the_crashed_job_finished_before_the_resume_is_legal(ledger: Ledger):
    record = _crash_then_resume(ledger, late_commits=1)

    assert _crash_problems(ledger, record) == []
    state = read_run(ledger, RUN)
    assert first_commit_after(state, record.seq_at_fault).version == 3  # the crashed job's
    recovery = first_recovery_commit(state, record.seq_at_fault)
    assert (recovery.version, recovery.epoch) == (4, 2)  # the resume's first


def test_a_resume_that_records_the_wrong_head_is_reported(ledger: Ledger):
    record = _crash_then_resume(ledger, late_commits=1, recorded_head=2)

    problems = _crash_problems(ledger, record)

    assert any("run_resumed records head v2" in p for p in problems), problems
    assert any("first version after the resume is v4, expected v3" in p for p in problems)


def test_without_a_late_commit_the_resume_continues_from_the_head_at_the_fault(ledger: Ledger):
    record = _crash_then_resume(ledger, late_commits=0)

    assert _crash_problems(ledger, record) == []
    assert first_recovery_commit(read_run(ledger, RUN), record.seq_at_fault).version == 3


def test_a_recovery_without_a_promotion_is_timed_to_the_next_commit(ledger: Ledger):
    epoch = ledger.promote(RUN, "cell-0", reason="start")
    _commit(ledger, "cell-0", epoch, 1)
    seq_at_fault = ledger.head(RUN).seq  # an engine died: same publisher, same epoch
    _commit(ledger, "cell-0", epoch, 2)

    recovery = first_recovery_commit(read_run(ledger, RUN), seq_at_fault)

    assert (recovery.version, recovery.epoch) == (2, 1)
