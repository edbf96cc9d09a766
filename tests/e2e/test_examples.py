"""The example a user copies runs as the README says: the console script, from the directory
the user is in, with a ``--custom-rm-path`` module that lives there (not installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
ORCHESTRATOR = Path(sys.executable).parent / "orchestrator"


@pytest.mark.timeout(600)
def test_the_math_example_runs_from_a_copy_with_its_reward_module_beside_it(tmp_path: Path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("model", "__pycache__"))
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["RAY_DISABLE_USAGE_STATS"] = "1"

    finished = subprocess.run(
        [str(ORCHESTRATOR), "run", "--config", "examples/math/run.yaml", "--num-epoch", "1",
         "--eval-interval", "8", "--runs-dir", "runs", "--run-id", "example", "--no-progress"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=540)

    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
    with Ledger.open(f"sqlite:///{tmp_path / 'runs' / 'example' / 'ledger.db'}",
                     readonly=True) as ledger:
        events = list(ledger.events("example"))
        assert ledger.verify("example").ok
    config = next(e for e in events if e.kind == "run_started").payload["config"]
    assert config["custom_rm_path"] == "examples.math.reward.score"
    assert sum(e.kind == "batch_trained" for e in events) == 256 // 16  # one epoch
    assert sum(e.kind == "eval_finished" for e in events) >= 1
