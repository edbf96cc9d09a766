"""Ledger reads retry a transient outage like writes do (a restarted database must not crash
the run's readers: the rollout manager and the driver read the head every step)."""

from __future__ import annotations

import pytest

from ledger import Ledger
from ledger.errors import LedgerUnavailableError


def _flaky(method, failures: int):
    calls = {"count": 0}

    def flaky(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] <= failures:
            raise LedgerUnavailableError("database unavailable: server restarting")
        return method(*args, **kwargs)

    return flaky, calls


def test_head_retries_until_the_database_answers(sqlite_url: str, monkeypatch) -> None:
    ledger = Ledger.open(sqlite_url)
    ledger.start_run("r")
    reader = Ledger.open(sqlite_url, readonly=True, retry_seconds=10)
    flaky, calls = _flaky(reader._head_row, failures=2)
    monkeypatch.setattr(reader, "_head_row", flaky)

    head = reader.head("r")

    assert calls["count"] == 3
    assert head.seq == 1 and head.version == 0
    reader.close()
    ledger.close()


def test_events_retry_a_page_until_the_database_answers(sqlite_url: str, monkeypatch) -> None:
    ledger = Ledger.open(sqlite_url)
    ledger.start_run("r")
    ledger.promote("r", "cell-0", reason="start")
    flaky, calls = _flaky(ledger._event_page, failures=1)
    monkeypatch.setattr(ledger, "_event_page", flaky)

    kinds = [event.kind for event in ledger.events("r")]

    assert calls["count"] == 2
    assert kinds == ["run_started", "cell_promoted"]
    ledger.close()


def test_a_read_gives_up_after_retry_seconds(sqlite_url: str, monkeypatch) -> None:
    Ledger.open(sqlite_url).start_run("r")
    reader = Ledger.open(sqlite_url, readonly=True, retry_seconds=0.3)
    flaky, calls = _flaky(reader._head_row, failures=10**6)
    monkeypatch.setattr(reader, "_head_row", flaky)

    with pytest.raises(LedgerUnavailableError):
        reader.head("r")

    assert calls["count"] > 1
    reader.close()
