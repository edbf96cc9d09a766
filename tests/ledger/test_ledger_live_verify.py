"""Snapshot reads: `verify` and the CLI's answers against a ledger that a writer process keeps
committing to, on SQLite and PostgreSQL. Zero false alarms, while reads that are not one
snapshot (events in pages, then the head) disagree with the head in the same conditions."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger import Ledger, fold
from ledger.cli.app import app
from tests.ledger_helpers import read_versions, start_commit_loop
from tests.waiting import wait_until

TRIES = 20
RUN = "live"
ENV = {"COLUMNS": "200", "LEDGER_DB": None}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture
def live_writer(ledger_url: str, tmp_path: Path):
    """A writer process committing to run ``live`` without pause until the test ends."""
    with Ledger.open(ledger_url) as ledger:
        ledger.start_run(RUN)
        epoch = ledger.promote(RUN, "cell-0")
    out = tmp_path / "writer.txt"
    writer = start_commit_loop(ledger_url, RUN, epoch, -1, out)
    wait_until(lambda: writer.poll() is not None
               or (out.exists() and len(read_versions(out)) >= 200),
               what="the writer's first 200 commits", timeout_s=60, interval_s=0.05)
    assert writer.poll() is None, "the writer died before the test began"
    yield ledger_url
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)


def test_verify_during_live_writes_raises_no_false_alarm(live_writer: str, capsys):
    url = live_writer
    alarms, moved, unsnapshotted_disagreements, cli_failures = [], 0, 0, []
    with Ledger.open(url, readonly=True) as reader:
        for attempt in range(TRIES):
            before = reader.head(RUN).seq
            report = reader.verify(RUN) if attempt % 2 else reader.verify()
            after = reader.head(RUN).seq
            moved += after > before
            if not report.ok:
                alarms.append((attempt, [str(p) for p in report.problems[:3]]))
            # The control: the same reads without a snapshot (pages, then the head row).
            replayed = fold(RUN, reader.events(RUN))
            unsnapshotted_disagreements += replayed.last_seq != reader.head(RUN).seq
            result = invoke("--db", url, "verify")
            if result.exit_code != 0:
                cli_failures.append((attempt, result.output[-500:]))
        final = reader.head(RUN).seq

    with capsys.disabled():
        print(f"\n[{url.split(':')[0]}] {TRIES} verifies + {TRIES} `ledger verify` during "
              f"writes (head seq -> {final}): {len(alarms)} + {len(cli_failures)} false alarms; "
              f"head moved during {moved}/{TRIES} verifies; non-snapshot reads disagreed "
              f"{unsnapshotted_disagreements}/{TRIES} times")
    assert alarms == [] and cli_failures == []
    assert moved >= TRIES // 2, "the writer was not writing during the verifies"
    assert unsnapshotted_disagreements > 0, "the race the snapshot avoids never happened"


def test_cli_answers_are_one_snapshot_during_live_writes(live_writer: str):
    for _ in range(5):
        logged = json.loads(invoke("--db", live_writer, "log", "-o", "json").stdout)
        status = json.loads(invoke("--db", live_writer, "status", "-o", "json").stdout)
        lag = json.loads(invoke("--db", live_writer, "lag", "-o", "json").stdout)

        events = logged["events"]
        assert [event["seq"] for event in events] == list(range(1, logged["header"]["seq"] + 1))
        assert events[-1]["hash"] == logged["header"]["head_hash"]
        committed = [event["version"] for event in events if event["version"] is not None]
        assert committed[-1] == logged["header"]["version"]
        assert status["last_seq"] == status["header"]["seq"]
        assert lag["unstamped_versions"][-1] == lag["header"]["version"]
