"""``bench/vs_peer.py``'s own logic, without TRL: the figures of a run, the tables, and the one
line for a peer python that cannot run TRL. (The benchmark itself runs in ``make bench``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import vs_peer  # noqa: E402  (a script directory, as the benchmarks import each other)


def steady_run(rewards: list[float], launched: float = 100.0, first: float = 110.0,
               per_step: float = 0.5) -> vs_peer.Run:
    times = [first + per_step * i for i in range(len(rewards))]
    return vs_peer.Run(launched=launched, exited=times[-1] + 2.0, rewards=rewards,
                       step_times=times)


def test_summary_times_the_reward_from_launch_and_from_step_one() -> None:
    rewards = [0.0] * 5 + [0.5] * 10  # the rolling mean of 5 first reaches 0.4 at step 9
    summary = vs_peer.summarise(steady_run(rewards), threshold=0.4)

    assert summary.steps_to == 9
    assert summary.from_step1_s == pytest.approx(8 * 0.5)
    assert summary.from_launch_s == pytest.approx(10.0 + 8 * 0.5)
    assert summary.startup_s == pytest.approx(10.0)
    assert summary.s_per_step == pytest.approx(0.5)
    assert summary.final_reward == pytest.approx(0.5)
    assert summary.whole_s == pytest.approx(10.0 + 14 * 0.5 + 2.0)


def test_a_run_that_never_gets_there_says_never() -> None:
    never = vs_peer.summarise(steady_run([0.1] * 10), threshold=0.4)
    reached = vs_peer.summarise(steady_run([0.9] * 10, per_step=1.0), threshold=0.4)
    text = vs_peer.table({vs_peer.PEER: [reached], "rl-ledger async": [never]}, 0.4)

    assert never.steps_to is None and never.from_launch_s is None
    ours = next(line for line in text.splitlines() if line.startswith("| rl-ledger async | 1"))
    assert "never" in ours
    ratio = text.splitlines()[-1]
    assert ratio.startswith("| rl-ledger async |") and "0.50x" in ratio  # s/step 0.5 vs 1.0


def test_table_gives_medians_with_spread_and_ratios_to_the_peer() -> None:
    peer = [vs_peer.summarise(steady_run([0.9] * 10, per_step=s), 0.4) for s in (1.0, 2.0, 3.0)]
    ours = [vs_peer.summarise(steady_run([0.9] * 10, per_step=s), 0.4) for s in (2.0, 4.0, 9.0)]

    text = vs_peer.table({vs_peer.PEER: peer, "rl-ledger async": ours}, 0.4)

    assert "| trl | 3 |" in text and "2.000 (1.000-3.000)" in text
    assert "4.000 (2.000-9.000)" in text
    assert "2.00x" in text.splitlines()[-1]  # s/step: median 4 over median 2


def test_a_peer_python_without_trl_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "vs_peer.py"), "--peer-python",
                           str(tmp_path / "no-such-python")],
                          capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--peer-python" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
