"""Fault primitives on real processes: find an actor's pid, SIGKILL it and wait for Ray to see
the death, freeze it with SIGSTOP, and the two publisher kills that must land at a precise
point of a step.

The precise kills are :class:`~orchestrator.control.hooks.JobHooks` subclasses, armed on a
drill through :meth:`DrillContext.arm`: the control plane calls them at its named hook points,
and they act on the processes from outside. No production object is modified.

Database outages (SQLite and PostgreSQL) are in :mod:`orchestrator.drills.outages`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from orchestrator.control.hooks import JobHooks
from orchestrator.drills.context import DrillContext, DrillError

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = [
    "CellTarget",
    "KillBetweenUpdateSteps",
    "MID_TRAIN_ATTEMPTS",
    "MidTrainKill",
    "actor_pid",
    "cpu_ns",
    "frozen",
    "kill_and_wait",
    "publisher_of",
]

MID_TRAIN_ATTEMPTS = 5  # training steps a mid-train kill may watch for one it can catch
_COMPUTING_NS = 2_000_000  # CPU time of a worker's main thread that means "in a step"
_POLL_S = 0.01


def _own_pid(actor_self: Any) -> int:
    return os.getpid()


def _own_pid_and_host(actor_self: Any) -> tuple[int, str]:
    return os.getpid(), ray.util.get_node_ip_address()


def actor_pid(actor: Any, timeout_s: float = 60.0) -> int:
    """The pid of the worker process that runs ``actor`` (any Ray actor handle), which must
    run on this machine: a pid from another machine names some unrelated process here, so
    signals and ``/proc`` reads are refused for it (faults there act through Ray: kill-node).

    Raises:
        DrillError: the actor runs on another machine.
        ray.exceptions.RayActorError: the actor is dead.
        ray.exceptions.GetTimeoutError: it did not answer within ``timeout_s``.
    """
    pid, host = ray.get(actor.__ray_call__.remote(_own_pid_and_host), timeout=timeout_s)
    if host != ray.util.get_node_ip_address():
        raise DrillError(f"the actor runs on {host}, not on this machine: its process cannot "
                         "be signalled from here")
    return int(pid)


def _still_answers(actor: Any, timeout_s: float) -> bool:
    try:
        ray.get(actor.__ray_call__.remote(_own_pid), timeout=timeout_s)
    except RayActorError:
        return False
    return True


def kill_and_wait(actor: Any, pid: int, timeout_s: float = 30.0) -> float:
    """SIGKILL ``pid`` (the actor's worker) and wait until a call on ``actor`` raises Ray's
    actor-death error. Returns the seconds from the signal to that error.

    Raises:
        TimeoutError: Ray did not report the actor dead within ``timeout_s`` (or a call on it
            hung that long).
    """
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    return wait_reported_dead(actor, pid, started, timeout_s)


def wait_reported_dead(actor: Any, pid: int, killed_at: float, timeout_s: float = 30.0) -> float:
    """Wait until a call on ``actor`` (whose worker ``pid`` was SIGKILLed at the monotonic time
    ``killed_at``) raises Ray's actor-death error; returns the seconds since the kill.

    Raises:
        TimeoutError: Ray did not report the actor dead within ``timeout_s``.
    """
    until_dead = Retrying(stop=stop_after_delay(timeout_s), wait=wait_fixed(_POLL_S),
                          retry=retry_if_result(bool))
    try:
        until_dead(_still_answers, actor, timeout_s)
    except (RetryError, GetTimeoutError):
        raise TimeoutError(f"actor of pid {pid} not reported dead within {timeout_s:g}s") from None
    return time.monotonic() - killed_at


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the body of the ``with`` block, then SIGCONT it (also on error).

    A frozen process holds its sockets and answers nothing: only a heartbeat timeout finds it.
    """
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def cpu_ns(pid: int) -> int:
    """CPU time of ``pid``'s main thread in ns (Linux ``/proc/PID/schedstat``), which is the
    thread a Ray worker runs its actor's tasks on; 0 if the process is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class CellTarget:
    """A cell to act on: its id, the epoch it publishes at, its actor handle and pid."""

    cell_id: str
    epoch: int
    actor: Any
    pid: int


def publisher_of(job: TrainingJob) -> CellTarget:
    """The publisher the ledger's head names, with its actor and pid.

    Raises:
        LedgerError: the head cannot be read.
        ray.exceptions.RayActorError: the publisher is already dead.
    """
    head = job.ledger.head(job.run_id)
    actor = job.supervisor.cells.actor(head.publisher_cell)
    return CellTarget(head.publisher_cell, head.epoch, actor, actor_pid(actor))


class MidTrainKill(JobHooks):
    """SIGKILL ``target`` while it computes a training step.

    From the next ``before_train_step`` on, a watcher thread waits until the target's main
    thread gains ``_COMPUTING_NS`` of CPU time (an idle Ray worker's main thread gains none),
    waits ``plan.delay_s`` and kills it. ``after_train_step`` stops and joins the watcher: a
    step too short to catch is let through and the next one is watched, up to ``attempts``
    steps, so the kill lands inside a step or not at all (and the drill then fails as "never
    fired"). The last check that the step is still running and the signal are taken under the
    lock that ``after_train_step`` takes to end the step, so the step cannot end between them
    (it did, in 1 of 6 chaos-mode drills, when the step ended during ``delay_s``).
    """

    def __init__(self, ctx: DrillContext, target: CellTarget,
                 attempts: int = MID_TRAIN_ATTEMPTS) -> None:
        self.ctx = ctx
        self.target = target
        self.attempts = attempts
        self.steps_watched = 0
        self._in_step = threading.Event()
        self._step_lock = threading.Lock()  # ends a step / checks it and kills, never both
        self._watcher: threading.Thread | None = None

    def before_train_step(self, job: TrainingJob, step: int) -> None:
        if self.ctx.record.fired or self.steps_watched >= self.attempts:
            return
        self.steps_watched += 1
        self._in_step.set()
        self._watcher = threading.Thread(target=self._kill_when_computing, args=(job,),
                                         name="drill-mid-train-kill", daemon=True)
        self._watcher.start()

    def after_train_step(self, job: TrainingJob, step: int) -> None:
        if self._watcher is None:
            return
        with self._step_lock:
            self._in_step.clear()
        self._watcher.join()
        self._watcher = None

    def _kill_when_computing(self, job: TrainingJob) -> None:
        pid = self.target.pid
        baseline = cpu_ns(pid)
        # A bounded wait, not a retry: the step's end (after_train_step) ends it.
        while self._in_step.is_set() and cpu_ns(pid) - baseline < _COMPUTING_NS:
            time.sleep(0.0005)
        if not self._in_step.is_set():
            return  # the step ended first: watch the next one
        time.sleep(self.ctx.plan.delay_s)
        with self._step_lock:
            during = self._in_step.is_set()
            if not during:
                return  # the step ended during the delay: watch the next one
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
        detect_s = wait_reported_dead(self.target.actor, pid, killed_at)
        self.ctx.fired(job, cell=self.target.cell_id, epoch=self.target.epoch, pid=pid,
                       during_train_step=during, steps_watched=self.steps_watched,
                       ray_detect_s=round(detect_s, 3))


class KillBetweenUpdateSteps(JobHooks):
    """At the next ``before_publish``, drive the publisher's public update steps by hand up to
    the planned point, then SIGKILL it; the job's own publish path runs next and must fail
    over.

    The publisher ``begin_update`` s and ``transfer`` s; with ``commit_first`` it also
    ``commit`` s (a death after the commit, before the stamp, leaves an audited
    committed-but-unstamped version). One shot: later publishes run untouched.
    """

    def __init__(self, ctx: DrillContext, *, commit_first: bool) -> None:
        self.ctx = ctx
        self.commit_first = commit_first
        self.done = False

    def before_publish(self, job: TrainingJob) -> None:
        if self.done:
            return
        self.done = True
        target = publisher_of(job)
        engines = list(job.supervisor.engines.values())
        ray.get(target.actor.begin_update.remote(engines, target.epoch))
        checksum = ray.get(target.actor.transfer.remote(engines, target.epoch))
        detail: dict[str, Any] = {"cell": target.cell_id, "epoch": target.epoch,
                                  "pid": target.pid}
        if self.commit_first:
            detail["committed"] = ray.get(target.actor.commit.remote(target.epoch, checksum))
        detect_s = kill_and_wait(target.actor, target.pid)
        self.ctx.fired(job, **detail, ray_detect_s=round(detect_s, 3))
