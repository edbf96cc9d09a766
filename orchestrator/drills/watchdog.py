"""The drills' watchdog: run a job on a thread under the drill's deadlines.

A recovery that never comes must fail the drill, not hang it: past ``deadline_s`` from the
start, or ``recover_deadline_s`` from the fault, the job's actors are killed so its thread
ends, and the timeout is reported with the negative staleness the rollout manager had counted
by then (a stuck run writes no ``run_finished`` with its counters).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import ray

from orchestrator.metric_keys import NEGATIVE_STALENESS_KEY
from orchestrator.drills.context import FaultRecord, utcnow_naive

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = ["run_with_deadlines"]

_POLL_S = 0.5


def run_with_deadlines(job: TrainingJob, record: FaultRecord, *, deadline_s: float,
                       recover_deadline_s: float | None = None) -> BaseException | None:
    """Run ``job.run()`` on a thread and return its error, or None when it finished.

    Past ``deadline_s`` from now, or ``recover_deadline_s`` after ``record.fired_at`` (if
    both are set), the job's manager, engines and cells are killed and a ``TimeoutError``
    naming the deadline is returned instead. Never raises for the job's own failure.
    """
    outcome: dict[str, BaseException | None] = {"error": None}

    def target() -> None:
        try:
            job.run()
        except BaseException as exc:  # noqa: BLE001 - reported in the verdict
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"drill-job-{job.run_id}", daemon=True)
    thread.start()
    missed = _join_within_deadlines(thread, record, deadline_s, recover_deadline_s)
    if missed is None:
        return outcome["error"]
    negative = _negative_staleness_now(job)
    _kill_actors(job)
    thread.join(120)
    return TimeoutError(f"no recovery: the run did not finish within {missed} "
                        f"(negative staleness counted so far: {negative})")


def _join_within_deadlines(thread: threading.Thread, record: FaultRecord, deadline_s: float,
                           recover_deadline_s: float | None) -> str | None:
    """None if ``thread`` ended in time, else which deadline passed (for the verdict)."""
    run_deadline = time.monotonic() + deadline_s
    # A bounded wait, not a retry: the thread is polled so the fault's time can be seen.
    while thread.is_alive():
        if time.monotonic() >= run_deadline:
            return f"{deadline_s:g}s"
        fired_at = record.fired_at
        if fired_at is not None and recover_deadline_s is not None and (
                (utcnow_naive() - fired_at).total_seconds() >= recover_deadline_s):
            return f"{recover_deadline_s:g}s of the fault"
        thread.join(timeout=_POLL_S)
    return None


def _kill_actors(job: TrainingJob) -> None:
    supervisor = job.supervisor
    for actor in [supervisor.manager, *supervisor.engines.values()]:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone (or never started)
            pass
    supervisor.cells.stop()


def _negative_staleness_now(job: TrainingJob) -> int | None:
    """The live count from the rollout manager (the job's own total is only updated at step
    ends, and a stuck job has none), or None if the manager does not answer."""
    try:
        metrics = ray.get(job.supervisor.manager.metrics.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - the manager may be the thing that is stuck
        return None
    return int(metrics.get(NEGATIVE_STALENESS_KEY, 0))
