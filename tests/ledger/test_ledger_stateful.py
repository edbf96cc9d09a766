"""Invariants 1-4 of DESIGN section 4 under random promotions, commits, stale writes and retries.

A Hypothesis state machine drives the real ledger (one run per example, on SQLite and on
PostgreSQL) beside a few lines of model: who the publisher is, the epoch, the head version and
what each idempotency key first returned.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger import FencedError, IdempotencyConflictError, Ledger

CELLS = ["cell-0", "cell-1", "cell-2"]
_run_ids = itertools.count()


class LedgerMachine(RuleBasedStateMachine):
    ledger: Ledger  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.run_id = f"stateful-{next(_run_ids)}"
        self.epoch = 0
        self.publisher: str | None = None
        self.version = 0
        self.epochs_held: dict[str, list[int]] = {cell: [] for cell in CELLS}
        self.keys: dict[str, int] = {}
        self.fenced_refusals = 0

    @initialize()
    def start(self) -> None:
        self.ledger.start_run(self.run_id)

    @rule(cell=st.sampled_from(CELLS))
    def promote(self, cell: str) -> None:
        epoch = self.ledger.promote(self.run_id, cell, reason="failover")
        self.epoch += 1
        assert epoch == self.epoch
        self.publisher = cell
        self.epochs_held[cell].append(epoch)

    @precondition(lambda self: self.publisher is not None)
    @rule(key=st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3", "k4"])))
    def commit_as_publisher(self, key: str | None) -> None:
        if key is not None and key in self.keys:
            return  # a reuse from another cell/epoch is covered by retry_same_key
        version = self.ledger.commit_weights(
            self.run_id, cell_id=self.publisher, epoch=self.epoch, train_step=self.version + 1,
            idempotency_key=key,
        )
        self.version += 1
        assert version == self.version
        if key is not None:
            self.keys[key] = version

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def retry_same_key(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.keys)))
        stored = next(
            e for e in self.ledger.events(self.run_id) if e.idempotency_key == key
        )
        # A true retry repeats every parameter (issue 13: a key reused with another train step
        # is a conflict, checked in reuse_key_with_another_step).
        version = self.ledger.commit_weights(
            self.run_id, cell_id=stored.cell_id, epoch=stored.epoch,
            train_step=stored.payload["train_step"], idempotency_key=key,
        )
        assert version == self.keys[key]

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def reuse_key_with_another_step(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.keys)))
        stored = next(
            e for e in self.ledger.events(self.run_id) if e.idempotency_key == key
        )
        head_before = self.ledger.head(self.run_id)
        with pytest.raises(IdempotencyConflictError):
            self.ledger.commit_weights(
                self.run_id, cell_id=stored.cell_id, epoch=stored.epoch,
                train_step=stored.payload["train_step"] + 1, idempotency_key=key,
            )
        assert self.ledger.head(self.run_id) == head_before

    @rule(cell=st.sampled_from(CELLS), epoch_back=st.integers(min_value=0, max_value=3))
    def commit_as_anyone(self, cell: str, epoch_back: int) -> None:
        epoch = self.epoch - epoch_back
        legitimate = cell == self.publisher and epoch == self.epoch and self.epoch > 0
        if legitimate:
            self.commit_as_publisher(None)
            return
        head_before = self.ledger.head(self.run_id)
        with pytest.raises(FencedError):
            self.ledger.commit_weights(
                self.run_id, cell_id=cell, epoch=epoch, train_step=self.version + 1
            )
        self.fenced_refusals += 1
        assert self.ledger.head(self.run_id) == head_before

    @invariant()
    def head_matches_model(self) -> None:
        head = self.ledger.head(self.run_id)
        assert (head.version, head.epoch, head.publisher_cell) == (
            self.version, self.epoch, self.publisher,
        )

    def teardown(self) -> None:
        report = self.ledger.verify(self.run_id)
        assert report.ok, report.problems
        events = list(self.ledger.events(self.run_id))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        commits = [e for e in events if e.kind == "weight_committed"]
        assert [e.version for e in commits] == list(range(1, self.version + 1))
        for commit in commits:
            assert commit.epoch in self.epochs_held[commit.cell_id]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ledger_invariants_hold_under_random_histories(backend: str, request) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    with Ledger.open(url) as ledger:
        LedgerMachine.ledger = ledger
        machine = LedgerMachine.TestCase
        machine.settings = settings(
            max_examples=40 if backend == "sqlite" else 20,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        machine().runTest()
