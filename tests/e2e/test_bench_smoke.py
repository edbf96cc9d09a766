"""Every benchmark of issue 11 runs end to end in its ``--quick`` mode and prints its table.

Benchmarks assert nothing about their figures (a shared machine is noisy); this only checks
that each one still runs against the current code. All but the drain benchmark take minutes
(Ray jobs, writer processes) and are marked slow (``make drills`` runs them, ``make test``
does not).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_quick(script: str, timeout: float) -> str:
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick"], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_drain_bench_prints_every_variant() -> None:
    out = run_quick("drain.py", timeout=300)

    for variant in ("| off |", "| ledger |", "| http-poll |", "| http-poll (no cache) |"):
        assert variant in out, out


@pytest.mark.slow  # spawns writer processes and uses PostgreSQL: minutes on a busy machine
def test_ledger_append_bench_prints_sqlite_and_the_fsync_floor() -> None:
    out = run_quick("ledger_append.py", timeout=300)

    assert "| SQLite (WAL, synchronous=FULL) | 1 |" in out, out
    assert "| SQLite (WAL, synchronous=FULL) | 4 |" in out, out
    assert "floor p50 ms" in out and "PROBLEMS" not in out, out


@pytest.mark.slow
def test_weight_update_bench_splits_full_and_lora() -> None:
    out = run_quick("weight_update.py", timeout=900)

    assert "| full |" in out and "| lora |" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("script", ["async_vs_sync.py", "time_to_reward.py"])
def test_job_benches_print_every_mode(script: str) -> None:
    out = run_quick(script, timeout=1800)

    for mode in ("| sync |", "| async |", "| async+partial |"):
        assert mode in out, out
    if script == "time_to_reward.py":  # every mode row says how many of its one run collapsed
        assert "| collapsed (final < 0.15) |" in out, out
        assert len(re.findall(r"\| [01] of 1( \(seed 1\))? \|", out)) == 3, out


@pytest.mark.slow  # builds 1k- and 5k-step ledgers on both backends and times the CLI
def test_ledger_growth_bench_prints_both_backends_with_a_clean_verify() -> None:
    out = run_quick("ledger_growth.py", timeout=900)

    assert "\nsqlite\n" in out and "| 5,000 | 20,002 |" in out, out
    assert "PROBLEMS" not in out, out


@pytest.mark.slow
def test_control_plane_bench_prints_every_phase_for_each_batch_size() -> None:
    out = run_quick("control_plane.py", timeout=900)

    assert "| 1 group(s) per call, in-flight | 8 group(s) per call, in-flight |" in out, out
    for row in ("| control plane (ms) |", "|   update: commit (ms) |", "| provenance (ms) |",
                "| manager CPU share of a core |", "| engine calls |"):
        assert row in out, out


@pytest.mark.slow
def test_campaign_stability_bench_prints_each_learning_rate() -> None:
    out = run_quick("campaign_stability.py", timeout=600)

    assert "| 0.003 | 1 |" in out and "| 0.001 | 1 |" in out, out
    assert "| 1 | 0.003 |" in out and "| 1 | 0.001 |" in out, out


@pytest.mark.slow  # starts the default job (a local Ray cluster) once
def test_startup_bench_prints_the_default_jobs_phases() -> None:
    out = run_quick("startup.py", timeout=600)

    assert "| variant | runs | launch -> step 1 |" in out, out
    row = next(line for line in out.splitlines() if line.startswith("| builtin | 1 |"))
    assert "| - |" not in row, out  # every phase measured, the driver's marks included
