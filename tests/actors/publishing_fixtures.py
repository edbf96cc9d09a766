"""A publishing cell beside an engine, on a real SQLite ledger: the set-up the update
sequence's tests and its tail's tests share (real TrainCell and RolloutEngine as plain
objects, no Ray)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from actors.engines.rollout_engine import RolloutEngine
from actors.policies.policy import PolicyConfig
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TrainCell
from ledger import Ledger

__all__ = ["CONFIG", "RUN", "TASK", "batch", "event_kinds", "publishing"]

TASK = AdditionTask(seed=0)
CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
RUN = "publishing"


def batch(engine: RolloutEngine) -> list:
    """Four groups of four samples from ``engine``: one train step's batch."""
    return [engine.generate(TASK.make_prompt(i), 4, i) for i in range(4)]


def event_kinds(ledger: Ledger) -> list[str]:
    """The kinds of the run's events, in order."""
    return [event.kind for event in ledger.events(RUN)]


@pytest.fixture
def publishing(sqlite_url: str) -> Iterator[tuple[Ledger, int, TrainCell, RolloutEngine]]:
    """A cell that trained one step (new weights), an idle engine, cell-0 promoted."""
    ledger = Ledger.open(sqlite_url)
    ledger.start_run(RUN)
    epoch = ledger.promote(RUN, "cell-0", reason="start")
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    cell = TrainCell("cell-0", "torch", CONFIG, 0, ledger_url=sqlite_url, run_id=RUN)
    cell.train_step(batch(engine))
    yield ledger, epoch, cell, engine
    cell.close()
    ledger.close()
