"""The whole job crashes mid-epoch on a data set: the `orchestrator run` process is SIGKILLed,
a second process resumes it, and the ledger alone shows every row of the epoch trained exactly
once (none skipped, none twice) and the crash's in-flight rows trained after the resume, on
SQLite and on PostgreSQL.

Fault schedule (declared up front; the test asserts it fired): SIGKILL the driver's process
group once the ledger holds ``KILL_AFTER_STEPS`` recorded steps and a checkpoint, which is
mid-epoch (``KILL_AFTER_STEPS * BATCH < ROWS``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ledger import EventKind, Ledger
from ledger.cli.lineage_query import prompts as prompt_query
from ledger.run_layout import default_ledger_url
from orchestrator.control.provenance_recorder import prompt_ledger
from tests.task_fixtures import addition_rows, make_tokenizer, write_jsonl
from tests.crash_job import due_for_the_kill, start_job
from tests.waiting import wait_until

RUN = "crash-data"
ROWS = 40
BATCH = 4
STEPS = 16  # 64 positions: epoch 0 (rows 0-39) and most of epoch 1
KILL_AFTER_STEPS = 5  # 20 rows trained: mid-epoch 0


def _orchestrator(runs_dir: Path, files: dict[str, Path], db: str | None,
                  *args: str) -> subprocess.Popen:
    # Bound 2: the kill must find rows in flight (at 1 the producer seldom runs ahead).
    flags = ["--num-rollout", str(STEPS), "--rollout-batch-size", str(BATCH),
             "--n-samples-per-prompt", "4", "--max-weight-staleness", "2",
             "--save-interval", "2", "--no-progress",
             "--run-id", RUN, "--prompt-data", str(files["data"]), "--tokenizer",
             str(files["tokenizer"]), "--rollout-shuffle", "--apply-chat-template",
             "--custom-rm-path", "tests.reward_fixtures.exact", *(["--db", db] if db else [])]
    return start_job(runs_dir, flags, *args)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_crash_mid_epoch_then_resume_trains_every_row_of_the_epoch_exactly_once(
        tmp_path: Path, request, backend: str):
    db = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    url = db or default_ledger_url(tmp_path / RUN)
    files = {"data": write_jsonl(tmp_path / "train.jsonl", addition_rows(ROWS)),
             "tokenizer": make_tokenizer(tmp_path / "tokenizer")}
    first = _orchestrator(tmp_path, files, db)
    wait_until(lambda: first.poll() is not None or due_for_the_kill(url, RUN, KILL_AFTER_STEPS),
               what=f"{KILL_AFTER_STEPS} trained steps and a checkpoint in the ledger",
               timeout_s=600, interval_s=0.1)
    assert first.poll() is None, first.communicate()[0][-3000:]
    os.killpg(first.pid, signal.SIGKILL)  # the whole job: driver and whatever it started
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL  # the fault fired
    with Ledger.open(url, readonly=True) as ledger:
        seen_at_kill = prompt_ledger(ledger.events(RUN))
    assert len(seen_at_kill.trained) < ROWS, "the crash was not mid-epoch"

    second = _orchestrator(tmp_path, files, db, "--resume")
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output[-3000:]

    with Ledger.open(url, readonly=True) as ledger:
        events = list(ledger.events(RUN))
        report = ledger.verify(RUN)
    assert report.ok, report.problems
    resumed = next(e for e in events if e.kind == EventKind.RUN_RESUMED)
    first_after = next(e for e in events if e.kind == EventKind.WEIGHT_COMMITTED
                       and e.seq > resumed.seq)
    assert first_after.version == resumed.payload["head_version"] + 1
    # The crashed job's account is the ledger's up to the resume: a write the killed job had in
    # flight can land, or become visible to a reader, after the kill (seen here: the step after
    # the one read right after the kill was on record at the resume), so that read is a lower
    # bound, not the account.
    crashed = prompt_ledger(e for e in events if e.seq < resumed.seq)
    assert crashed.last_step >= seen_at_kill.last_step
    assert resumed.payload["next_prompt_index"] == crashed.next_index
    # From the ledger alone: epoch 0's 40 rows each trained once, none skipped.
    prompts = prompt_ledger(events)
    assert prompts.twice == []
    epoch_zero = set(range(ROWS))
    assert epoch_zero <= set(prompts.trained), sorted(epoch_zero - set(prompts.trained))
    answer = prompt_query(url, RUN)
    assert answer["epochs"][0] == {"epoch": 0, "rows": ROWS, "trained": ROWS, "dropped": {},
                                   "in_flight": 0, "not_issued": 0, "trained_twice": 0,
                                   "balanced": True}
    assert all(epoch["balanced"] for epoch in answer["epochs"])
    # What was in flight at the crash was trained after the resume.
    assert crashed.in_flight
    after = {index for index, step in prompts.trained.items() if step > crashed.last_step}
    assert set(crashed.in_flight) <= after
