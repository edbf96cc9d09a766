"""The mid-train kill lands inside a training step or not at all: a step that ends while the
kill waits out its delay is let through, and the next step is watched instead.

The target is a real process burning CPU (what a training cell's main thread does); the fault
primitive watches its CPU time and signals it exactly as in a drill.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from orchestrator.drills.context import FaultPlan, FaultRecord
from orchestrator.drills.faults import CellTarget, MidTrainKill, cpu_ns
from tests.waiting import wait_until

BUSY = "while True: pass"


@pytest.fixture
def busy_process():
    process = subprocess.Popen([sys.executable, "-c", BUSY])
    yield process
    process.kill()
    process.wait(timeout=30)


def _kill_hook(process: subprocess.Popen, delay_s: float) -> tuple[MidTrainKill, list]:
    fired: list[dict] = []
    ctx = SimpleNamespace(plan=FaultPlan("kill-publisher-mid-train", 2, "mid-train",
                                         delay_s=delay_s),
                          record=FaultRecord(), fired=lambda job, **detail: fired.append(detail))
    target = CellTarget("cell-0", 1, actor=None, pid=process.pid)
    return MidTrainKill(ctx, target), fired


def test_a_step_that_ends_during_the_kill_delay_is_let_through(busy_process):
    hook, fired = _kill_hook(busy_process, delay_s=2.0)
    started = cpu_ns(busy_process.pid)

    hook.before_train_step(None, 2)
    # Well past the watcher's threshold, so it is waiting out its 2 s delay.
    wait_until(lambda: cpu_ns(busy_process.pid) - started > 50_000_000,
               what="the target computing", timeout_s=30)
    hook.after_train_step(None, 2)  # the step ends before the delay does

    assert busy_process.poll() is None, "killed after its step had ended"
    assert fired == []
    assert hook.steps_watched == 1  # the next step will be watched

