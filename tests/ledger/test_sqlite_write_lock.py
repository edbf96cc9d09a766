"""How a SQLite writer waits for the database write lock another process holds
(``ledger.store.connection``): up to SQLite's busy timeout, and a lock held past it is the
ledger's own unavailable error, with nothing written."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledger import Ledger, LedgerUnavailableError
from ledger.store import connection

RUN = "locked"


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the database write lock (``BEGIN IMMEDIATE``) for the
    block, as a second writer process would."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


def release_after(holder: sqlite3.Connection, seconds: float) -> threading.Timer:
    """Roll the holder's transaction back ``seconds`` from now, on a timer thread."""
    timer = threading.Timer(seconds, holder.execute, ("ROLLBACK",))
    timer.start()
    return timer


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    with Ledger.open(sqlite_url) as opened:
        opened.start_run(RUN)
        yield opened


def test_a_writer_waits_for_a_held_write_lock_and_then_writes(
        ledger: Ledger, sqlite_url: str, sqlite_path: Path):
    with Ledger.open(sqlite_url, retry_seconds=0) as unretried:  # the wait is SQLite's own
        with write_lock_held(sqlite_path) as holder:
            timer = release_after(holder, 0.2)
            epoch = unretried.promote(RUN, "cell-0")
            timer.join()

    assert epoch == 1 and ledger.head(RUN).epoch == 1
    assert ledger.verify(RUN).ok


def test_a_lock_held_past_the_busy_timeout_is_unavailable_and_writes_nothing(
        ledger: Ledger, sqlite_url: str, sqlite_path: Path, monkeypatch):
    monkeypatch.setattr(connection, "SQLITE_BUSY_TIMEOUT_MS", 100)
    seq_before = ledger.head(RUN).seq

    with Ledger.open(sqlite_url, retry_seconds=0.3) as impatient:
        with write_lock_held(sqlite_path), pytest.raises(LedgerUnavailableError,
                                                         match="database is locked"):
            impatient.promote(RUN, "cell-0")
        head = impatient.head(RUN)
        assert (head.seq, head.epoch) == (seq_before, 0)
        assert impatient.promote(RUN, "cell-0") == 1  # the lock is free: the write goes through
