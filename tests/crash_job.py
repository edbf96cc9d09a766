"""The whole job as a subprocess to SIGKILL, and what its ledger has recorded so far: shared by
the crash tests (the built-in task and a data set)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger import EventKind, Ledger, LedgerError


def start_job(runs_dir: Path, flags: list[str], *args: str) -> subprocess.Popen:
    """``orchestrator run --runs-dir RUNS_DIR FLAGS ARGS`` in a new session (killable as one)."""
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "run",
         "--runs-dir", str(runs_dir), *flags, *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


def recorded(url: str, run_id: str) -> tuple[int, int]:
    """(batch_trained events, checkpoints) in the ledger so far; (0, 0) before it exists."""
    try:
        with Ledger.open(url, readonly=True, retry_seconds=0) as ledger:
            kinds = [event.kind for event in ledger.events(run_id)]
    except LedgerError:
        return 0, 0
    return kinds.count(EventKind.BATCH_TRAINED), kinds.count(EventKind.CHECKPOINT_SAVED)


def due_for_the_kill(url: str, run_id: str, trained_steps: int) -> bool:
    """Whether the ledger holds ``trained_steps`` trained steps and a checkpoint."""
    trained, checkpoints = recorded(url, run_id)
    return trained >= trained_steps and checkpoints >= 1
