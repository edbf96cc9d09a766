"""The whole job crashes: the `orchestrator run` process is SIGKILLed mid-run, a second process
resumes it, and the ledger alone shows that every prompt is accounted for exactly once.

Fault schedule (declared up front; the test asserts it fired): SIGKILL the driver process once
the ledger holds ``KILL_AFTER_STEPS`` recorded training steps and a checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ledger import EventKind, Ledger
from ledger.run_layout import default_ledger_url
from orchestrator.control.provenance_recorder import prompt_ledger
from tests.crash_job import due_for_the_kill, start_job
from tests.waiting import wait_until

RUN = "crash"
STEPS = 18
KILL_AFTER_STEPS = 6
# A staleness bound of 2 lets the producer run a batch ahead, so the kill finds prompts drained
# or generating but not trained: the case this test is about (at 1 it often finds none).
JOB_FLAGS = ["--num-rollout", str(STEPS), "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "4", "--save-interval", "3", "--no-progress",
             "--max-weight-staleness", "2", "--run-id", RUN]


def _orchestrator(runs_dir: Path, *args: str) -> subprocess.Popen:
    return start_job(runs_dir, JOB_FLAGS, *args)


@pytest.mark.timeout(900)
def test_a_resume_after_the_driver_is_killed_accounts_for_every_prompt_exactly_once(
    tmp_path: Path,
):
    url = default_ledger_url(tmp_path / RUN)
    first = _orchestrator(tmp_path)
    wait_until(lambda: first.poll() is not None or due_for_the_kill(url, RUN, KILL_AFTER_STEPS),
               what=f"{KILL_AFTER_STEPS} trained steps and a checkpoint in the ledger",
               timeout_s=600, interval_s=0.1)
    assert first.poll() is None, first.communicate()[0][-3000:]
    os.kill(first.pid, signal.SIGKILL)  # the driver alone: Ray must clean up after it
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL  # the fault fired
    with Ledger.open(url, readonly=True) as ledger:
        head_at_crash = ledger.head(RUN)
        crashed = prompt_ledger(ledger.events(RUN))

    second = _orchestrator(tmp_path, "--resume")
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output[-3000:]

    with Ledger.open(url, readonly=True) as ledger:
        events = list(ledger.events(RUN))
        report = ledger.verify(RUN)
    prompts = prompt_ledger(events)
    resumed = next(e for e in events if e.kind == EventKind.RUN_RESUMED)
    promotions = [e for e in events if e.kind == EventKind.CELL_PROMOTED]
    commits = [e for e in events if e.kind == EventKind.WEIGHT_COMMITTED]
    versions = [e.version for e in commits]

    assert report.ok, report.problems
    assert versions == list(range(1, len(versions) + 1))
    assert versions[-1] > head_at_crash.version
    promotion = next(e for e in promotions if e.seq > head_at_crash.seq)
    assert promotion.payload["reason"] == "resume"
    assert promotion.epoch == head_at_crash.epoch + 1  # the old job is fenced
    # Only the driver died: its cells live on until Ray reaps them, so the publisher may finish
    # the update it was in after the head was read above. Such a commit is legal: it carries the
    # old epoch and lands before the resume's promotion, which fences it from then on.
    late = [e for e in commits if head_at_crash.seq < e.seq < promotion.seq]
    assert all(e.epoch == head_at_crash.epoch for e in late), late
    # The resume records the head at its promotion; its first commit is that head + 1, and
    # every commit from the promotion on carries the new epoch.
    assert resumed.seq > promotion.seq
    assert resumed.payload["head_version"] == head_at_crash.version + len(late)
    first_after = next(e for e in commits if e.seq > resumed.seq)
    assert first_after.version == resumed.payload["head_version"] + 1
    assert {e.epoch for e in commits if e.seq > promotion.seq} == {promotion.epoch}
    # The prompt stream continued where the ledger said it stopped.
    assert resumed.payload["ledger_step"] == crashed.last_step
    assert resumed.payload["next_prompt_index"] == crashed.next_index
    # Exactly once: no prompt trained twice, none lost, every step recorded once.
    assert prompts.twice == []
    assert not set(prompts.trained) & set(prompts.dropped)
    steps = [e.payload["train_step"] for e in events if e.kind == EventKind.BATCH_TRAINED]
    assert sorted(steps) == list(range(1, STEPS + 1))
    issued = set(range(prompts.next_index))
    assert set(prompts.trained) | set(prompts.dropped) | set(prompts.in_flight) == issued
    assert set(crashed.trained) <= set(prompts.trained)
    # What was in flight at the crash was re-queued first, so by the end it is settled.
    assert crashed.in_flight
    assert set(crashed.in_flight) <= set(prompts.trained) | set(prompts.dropped)
