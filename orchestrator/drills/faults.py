"""Fault primitives on real processes: find an actor's pid, SIGKILL it and wait for Ray to see
the death, freeze it with SIGSTOP, and the two publisher kills that must land at a precise
point of a step.

The precise kills are :class:`~orchestrator.control.hooks.JobHooks` subclasses, armed on a
drill through :meth:`DrillContext.arm`: the control plane calls them at its named hook points,
and they act on the processes from outside. A kill inside a weight update arms a named point
of THE update sequence on the publisher cell (``TrainCell.arm_update_fault``,
:class:`actors.publishing.sequence.UpdatePoint`), lets the job's normal publish run into it (the
cell freezes itself there), then SIGKILLs the frozen cell: the death lands in the production
path. No production object is modified.

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

from actors.cluster.node_info import node_and_host
from actors.publishing.weight_sync import load_staged_weights
from actors.publishing.sequence import FaultAction, UpdatePoint
from orchestrator.control.hooks import JobHooks
from orchestrator.drills.context import DrillContext, DrillError

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = [
    "CellTarget",
    "KillAtUpdatePoint",
    "MID_TRAIN_ATTEMPTS",
    "MidTrainKill",
    "actor_pid",
    "arm_update_stop",
    "cpu_ns",
    "frozen",
    "is_stopped",
    "kill_and_wait",
    "publisher_of",
    "wait_stopped",
    "zombie_commit",
    "zombie_transfer",
]

MID_TRAIN_ATTEMPTS = 5  # training steps a mid-train kill may watch for one it can catch
UPDATE_POINT_TIMEOUT_S = 180.0  # how long a publish may take to reach an armed point
_COMPUTING_NS = 2_000_000  # CPU time of a worker's main thread that means "in a step"
_POLL_S = 0.01


def _own_pid(actor_self: Any) -> int:
    return os.getpid()


def _own_pid_and_host(actor_self: Any) -> tuple[int, str]:
    return os.getpid(), node_and_host()[1]


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
    if host != node_and_host()[1]:
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


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T`` in Linux ``/proc/PID/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].startswith(("T", "t"))


def wait_stopped(pid: int, timeout_s: float = UPDATE_POINT_TIMEOUT_S) -> bool:
    """Wait until ``pid`` is stopped (it froze itself at an armed point); False after
    ``timeout_s`` or if it is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_stopped(pid):
            return True
        if not Path(f"/proc/{pid}").exists():
            return False
        time.sleep(_POLL_S)
    return False


def arm_update_stop(target: CellTarget, point: UpdatePoint) -> None:
    """Arm ``point`` of the next weight update on ``target``: the cell will SIGSTOP itself
    there (:meth:`actors.train_cell.TrainCell.arm_update_fault`).

    Raises:
        ray.exceptions.RayActorError: the cell is dead.
        ray.exceptions.GetTimeoutError: it did not answer within 60 s.
    """
    ray.get(target.actor.arm_update_fault.remote(point, FaultAction.STOP), timeout=60)


class KillAtUpdatePoint(JobHooks):
    """At the next ``before_publish``, arm ``point`` on the publisher (it freezes there during
    the job's own publish), then SIGKILL it from a watcher thread once it is frozen; the
    publish fails over. At :attr:`UpdatePoint.AFTER_COMMIT` the detail records the version
    committed and never stamped (the ledger head while the cell is frozen). One shot: later
    publishes run untouched.
    """

    def __init__(self, ctx: DrillContext, point: UpdatePoint) -> None:
        self.ctx = ctx
        self.point = point
        self.done = False

    def before_publish(self, job: TrainingJob) -> None:
        if self.done:
            return
        self.done = True
        target = publisher_of(job)
        arm_update_stop(target, self.point)
        self.ctx.background(threading.Thread(target=self._kill_when_frozen, args=(job, target),
                                             name="drill-update-kill", daemon=True))

    def _kill_when_frozen(self, job: TrainingJob, target: CellTarget) -> None:
        if not wait_stopped(target.pid):
            return  # never reached: the drill fails as "never fired"
        detail: dict[str, Any] = {"cell": target.cell_id, "epoch": target.epoch,
                                  "pid": target.pid, "update_point": str(self.point)}
        if self.point is UpdatePoint.AFTER_COMMIT:
            detail["committed"] = job.ledger.head(job.run_id).version
        # Recorded while the cell is frozen: the failover the kill starts comes after it.
        self.ctx.fired(job, **detail)
        detect_s = kill_and_wait(target.actor, target.pid)
        self.ctx.record.detail["ray_detect_s"] = round(detect_s, 3)


def zombie_commit(cell: Any, epoch: int) -> int:
    """Run inside a cell (``actor.__ray_call__.remote(zombie_commit, epoch)``): step 4 of the
    update sequence, the cell's own fenced commit of a made-up checksum, at ``epoch``."""
    return cell.records.commit(epoch, cell.train_step_count, cell.transport, None,
                               "0" * 64).version


def zombie_transfer(cell: Any, engines: list[Any], epoch: int) -> str:
    """Run inside a cell: step 3 of the update sequence (3a stage, 3b load into every
    engine) with the cell's weights, at ``epoch``, with no pause before them."""
    return load_staged_weights(engines, cell.stage(engines), epoch, cell.transport)
