"""The indexed reads cost the same in a long run as in a short one (issue 22): counted in
SQLite virtual-machine instructions, not seconds, so the check does not depend on the machine.
A query that walks the run (a primary-key scan, an index scan for min and max at once) costs
ten times more in a run ten times longer."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ledger import Ledger
from ledger.store.plain import _Sqlite3Rows  # the CLI's executor over sqlite3
from ledger.store.reads import Reader

RUN = "long"
SMALL, LARGE = 2_000, 20_000  # steps of the two runs compared


def _grown(path: Path, steps: int) -> sqlite3.Connection:
    """A ledger (the migrated schema) whose run holds ``steps`` steps of a commit and a batch,
    as rows written directly (what is measured is reading, not the chain)."""
    url = f"sqlite:///{path}"
    with Ledger.open(url) as ledger:
        ledger.start_run(RUN)
    conn = sqlite3.connect(path)
    events, uses = [], []
    for step in range(1, steps + 1):
        commit_seq, batch_seq = 2 * step, 2 * step + 1
        events.append((RUN, commit_seq, "weight_committed", step, None, f"c{step}", "{}",
                       bytes(32), 0, step))
        events.append((RUN, batch_seq, "batch_trained", None, None, f"b{step}", "{}",
                       bytes(32), 0, step))
        uses.append((RUN, step - 1, batch_seq, step, 8))
    conn.executemany("INSERT INTO ledger_events (run_id, seq, kind, version, epoch, "
                     "idempotency_key, payload, hash, recorded_at, train_step) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
    conn.executemany("INSERT INTO version_uses (run_id, version, seq, train_step, samples) "
                     "VALUES (?, ?, ?, ?, ?)", uses)
    conn.commit()
    return conn


def _instructions(conn: sqlite3.Connection, read: Callable[[Reader], object]) -> int:
    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        read(Reader(_Sqlite3Rows(conn)))
    finally:
        conn.set_progress_handler(None, 10)
    return counted[0] * 10


READS: dict[str, Callable[[int], Callable[[Reader], object]]] = {
    "batch_at_step": lambda steps: lambda r: r.batch_at_step(RUN, steps // 2),
    "step_bounds": lambda steps: lambda r: r.step_bounds(RUN),
    "event_at_version": lambda steps: lambda r: r.event_at_version(RUN, steps // 2),
    "version_uses": lambda steps: lambda r: r.version_uses(RUN, steps // 2),
    "version_uses_from": lambda steps: lambda r: r.version_uses_from(RUN, 2 * steps - 200),
    "earlier_keys": lambda steps: lambda r: r.earlier_keys(RUN, 2 * steps - 200),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, sqlite3.Connection]:
    folder = tmp_path_factory.mktemp("read-costs")
    return {steps: _grown(folder / f"{steps}.db", steps) for steps in (SMALL, LARGE)}


@pytest.mark.parametrize("name", sorted(READS))
def test_an_indexed_read_costs_the_same_in_a_run_ten_times_longer(runs, name: str) -> None:
    small = _instructions(runs[SMALL], READS[name](SMALL))
    large = _instructions(runs[LARGE], READS[name](LARGE))

    assert large < 2 * max(small, 100), (name, small, large)
