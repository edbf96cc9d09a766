"""The nemesis inside the job: fire each planned fault at its step, with the drills' primitives.

:class:`ChaosHooks` is the :class:`~orchestrator.control.hooks.JobHooks` of a campaign's job.
At every step's end it fires the faults that are due (their planned step reached, not recorded
as fired yet), each through the drill scenario of the same name
(:data:`orchestrator.drills.scenarios.SCENARIOS`): the same SIGKILL/SIGSTOP of real worker
processes, the same armed kills inside a weight update, the same database outages. Each fault
acts through its own :class:`FaultContext` (the drills'
:class:`~orchestrator.drills.context.DrillContext`), which records ``fault_injected`` with the
planned fault (index, step, kind) as the fault fires.

Two kinds kill the job itself (``kill-driver``, ``kill-everything``): they reuse the crash
drill's :class:`~orchestrator.drills.crash.CrashHooks`, which SIGKILL this process (and the
job's workers); the campaign runner (:mod:`orchestrator.chaos.campaign`) resumes the run in a new
process, whose hooks skip every fault the ledger already records as fired.

A fault planned into another's recovery (``--overlap``, :attr:`PlannedFault.after`) fires at the
first hook point of the job after its predecessor fired: the next
``before_train_step`` after a fault fired at a step's end (the boundary has sorted out what it
could, the step that recovers has not committed), the first hook of a resumed job after a job
kill, the ``before_publish`` of the retried update attempt after a publisher was killed inside
an update (after the failover, before the new publisher's first commit). A kind that acts
at a later point of a step fires only where that point is still ahead (:data:`_CHAINED_HOOKS`).
Whether it really landed inside the recovery is judged afterwards from the ledger alone
(:func:`~orchestrator.chaos.recovery.fired_faults`), not taken from the plan.

A fault that cannot be injected at its step (``kill-follower`` while the only follower is still
being healed) is tried again at the next step's end (a chained one at the next hook point), up to
:data:`MAX_DEFERRALS` times, then left unfired: the campaign reports planned against fired. A
chained fault whose predecessor never fires is released to fire at a step's end
:data:`MAX_DEFERRALS` steps after its planned step.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledger import EventKind, Ledger
from orchestrator.chaos.nemesis import FaultKind, PlannedFault
from orchestrator.control.hooks import JobHooks
from orchestrator.drills.context import DrillPoint, FaultPlan, FaultRecord
from orchestrator.drills.crash import CRASH_POINTS, CrashHooks
from orchestrator.drills.faults import actor_pid
from orchestrator.drills.node_loss import MIN_WORKER_NODES, NODE_SCENARIOS
from orchestrator.drills.scenarios import SCENARIOS, UPDATE_KILL_POINTS

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob
    from orchestrator.control.placement.local import LocalCluster

__all__ = ["MAX_DEFERRALS", "ChaosHooks", "FaultContext", "fired_indices"]

logger = logging.getLogger(__name__)

MAX_DEFERRALS = 5  # step ends a fault that cannot be injected yet is tried again at
_CRASHES = {FaultKind.KILL_DRIVER: "driver", FaultKind.KILL_EVERYTHING: "everything"}
# Where each kind may land (the drill points its scenario knows); one is drawn per fault.
_POINTS: dict[FaultKind, tuple[DrillPoint, ...]] = {
    FaultKind.KILL_PUBLISHER_MID_TRAIN: (DrillPoint.MID_TRAIN,),
    FaultKind.KILL_PUBLISHER_MID_TRANSFER: tuple(p for p in UPDATE_KILL_POINTS
                                                 if p is not DrillPoint.BEFORE_STAMP),
    FaultKind.KILL_PUBLISHER_AFTER_COMMIT: (DrillPoint.BEFORE_STAMP,),
    FaultKind.ZOMBIE_PUBLISHER: (DrillPoint.FROZEN,),
    FaultKind.FREEZE_ENGINE: (DrillPoint.FROZEN,),
    FaultKind.FREEZE_FOLLOWER: (DrillPoint.FROZEN,),
    FaultKind.FREEZE_ROLLOUT_MANAGER: (DrillPoint.FROZEN,),
    FaultKind.KILL_DRIVER: CRASH_POINTS,
    FaultKind.KILL_EVERYTHING: CRASH_POINTS,
}


class HookPoint(str, enum.Enum):
    """The job's hook points, in the order a step reaches them."""

    BEFORE_TRAIN_STEP = "before_train_step"
    AFTER_TRAIN_STEP = "after_train_step"
    BEFORE_PUBLISH = "before_publish"
    ON_STEP_END = "on_step_end"


# Where a chained fault may fire. A mid-train kill acts in the train step ahead, so only
# before one; a zombie publisher publishes a version of its own inside its hook, which only a
# step's end leaves the step's staleness bound intact for. Every other kind acts at once or at
# the step's publish, both still ahead at any point.
_CHAINED_HOOKS: dict[FaultKind, tuple[HookPoint, ...]] = {
    FaultKind.KILL_PUBLISHER_MID_TRAIN: (HookPoint.BEFORE_TRAIN_STEP, HookPoint.ON_STEP_END),
    FaultKind.ZOMBIE_PUBLISHER: (HookPoint.ON_STEP_END,),
}


def fired_indices(ledger: Ledger, run_id: str) -> set[int]:
    """The planned faults of ``run_id`` that its ledger records as fired (``fault_injected``
    with a ``fault`` index)."""
    return {int(event.payload["fault"]["index"]) for event in ledger.events(run_id)
            if event.kind == EventKind.FAULT_INJECTED and event.payload.get("fault")}


@dataclass
class FaultContext:
    """One planned fault as the drill primitives see it (a
    :class:`~orchestrator.drills.context.DrillContext`)."""

    fault: PlannedFault
    plan: FaultPlan
    rng: random.Random
    run_id: str
    ledger_url: str
    ledger: Ledger
    cluster: LocalCluster | None
    hooks: ChaosHooks
    record: FaultRecord = field(default_factory=FaultRecord)

    def fired(self, job: TrainingJob, **detail: Any) -> None:
        """Record that the fault fired now, and append its ``fault_injected``."""
        self.record.mark_fired(job.ledger.head(job.run_id), **detail)
        self.record_fault_event()

    def record_fault_event(self) -> None:
        """Append ``fault_injected`` from :attr:`record` (with the planned fault)."""
        payload = self.record.fault_injected(self.plan)
        payload["detail"]["seq_at_fault"] = self.record.seq_at_fault
        self.ledger.append(self.run_id, EventKind.FAULT_INJECTED,
                           {"fault": self.fault.to_payload(), **payload})

    def background(self, thread: threading.Thread) -> None:
        """Start ``thread``; the job's process joins it before it exits."""
        self.hooks.threads.append(thread)
        thread.start()

    def arm(self, hooks: JobHooks) -> None:
        """Call ``hooks`` at every hook point of the job from now on."""
        self.hooks.armed.append(hooks)


class ChaosHooks(JobHooks):
    """Fire ``schedule``'s faults (less those in ``already_fired``) at their steps' ends.

    Hook errors of a fault are logged and never end the run: the campaign judges what the
    ledger shows afterwards. ``frozen_s`` bounds how long a frozen engine or follower stays
    stopped when the supervisor has not replaced it by then.
    """

    def __init__(self, schedule: list[PlannedFault], already_fired: set[int], *, seed: int,
                 ledger: Ledger, ledger_url: str, cluster: LocalCluster | None = None,
                 frozen_s: float = 120.0) -> None:
        self.pending = [fault for fault in schedule if fault.index not in already_fired]
        self.seen_fired = set(already_fired)  # their chained faults may fire
        self.given_up: set[int] = set()
        self.contexts: dict[int, FaultContext] = {}
        self.seed = seed
        self.ledger = ledger
        self.ledger_url = ledger_url
        self.cluster = cluster
        self.frozen_s = frozen_s
        self.armed: list[JobHooks] = []
        self.threads: list[threading.Thread] = []
        self.deferrals: dict[int, int] = {}
        self.nodes_to_replace: list[FaultContext] = []

    # ---- the job's hook points, forwarded to the armed faults

    def before_train_step(self, job: TrainingJob, step: int) -> None:
        self._fire_chained(job, step, HookPoint.BEFORE_TRAIN_STEP)
        self._each_armed(lambda hooks: hooks.before_train_step(job, step))

    def after_train_step(self, job: TrainingJob, step: int) -> None:
        self._fire_chained(job, step, HookPoint.AFTER_TRAIN_STEP)
        self._each_armed(lambda hooks: hooks.after_train_step(job, step))

    def before_publish(self, job: TrainingJob) -> None:
        self._fire_chained(job, job.step, HookPoint.BEFORE_PUBLISH)
        self._each_armed(lambda hooks: hooks.before_publish(job))

    def on_step_end(self, job: TrainingJob, step: int) -> None:
        self._join_nodes()
        self._fire_chained(job, step, HookPoint.ON_STEP_END)
        for fault in [f for f in self.pending if f.step <= step and self._released(f, step)]:
            self._fire(fault, job, step)
        self._each_armed(lambda hooks: hooks.on_step_end(job, step))

    def join(self, timeout_s: float = 300.0) -> None:
        """Wait for the faults' background threads (an outage recording itself when over)."""
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # ---- firing

    def _fire_chained(self, job: TrainingJob, step: int, hook: HookPoint) -> None:
        """Fire each pending fault planned into the recovery of a fault that fired before this
        hook point (at an earlier one, or since from a thread of its own), where its kind may
        fire (:data:`_CHAINED_HOOKS`)."""
        self.seen_fired |= {index for index, ctx in self.contexts.items() if ctx.record.fired}
        for fault in [f for f in self.pending if f.after is not None
                      and f.after in self.seen_fired
                      and hook in _CHAINED_HOOKS.get(f.kind, tuple(HookPoint))]:
            self._fire(fault, job, step, hook)

    def _released(self, fault: PlannedFault, step: int) -> bool:
        """Whether ``fault`` may fire at the end of ``step``: it is not chained, or its
        predecessor was given up, or it has waited :data:`MAX_DEFERRALS` steps for it."""
        return (fault.after is None or fault.after in self.given_up
                or step >= fault.step + MAX_DEFERRALS)

    def _fire(self, fault: PlannedFault, job: TrainingJob, step: int,
              hook: HookPoint = HookPoint.ON_STEP_END) -> None:
        ctx = self._context(fault, step, hook)
        logger.warning("chaos: fault %d (%s, %s) at %s of step %d%s", fault.index,
                       fault.kind.value, ctx.plan.point, hook.value, step + 1,
                       "" if fault.after is None else f", in the recovery of fault {fault.after}")
        self.pending.remove(fault)
        self.contexts[fault.index] = ctx
        try:
            self._inject(ctx, job, step)
        except Exception as exc:  # noqa: BLE001 - judged from the ledger, never ends the run
            if ctx.record.fired:
                logger.warning("chaos: fault %d failed after firing: %s", fault.index, exc)
                return
            tries = self.deferrals.get(fault.index, 0) + 1
            self.deferrals[fault.index] = tries
            if tries <= MAX_DEFERRALS:
                logger.warning("chaos: fault %d cannot be injected yet (%s: %s); next step",
                               fault.index, type(exc).__name__, exc)
                self.pending.insert(0, fault)
            else:
                logger.warning("chaos: fault %d never injected: %s", fault.index, exc)
                self.given_up.add(fault.index)

    def _context(self, fault: PlannedFault, step: int, hook: HookPoint) -> FaultContext:
        rng = random.Random(f"{self.seed}:{fault.index}")
        points = _POINTS.get(fault.kind, (DrillPoint.BETWEEN_STEPS,))
        plan = FaultPlan(fault.kind.value, step, rng.choice(points),
                         delay_s=round(rng.uniform(0.0, 0.005), 4),
                         hold_s=round(rng.uniform(2.0, 5.0), 1))
        ctx = FaultContext(fault, plan, rng, "", self.ledger_url, self.ledger, self.cluster,
                           self)  # the run id is the job's, set as the fault fires
        if fault.after is not None:
            ctx.record.detail.update(hook=hook.value, planned_after=fault.after)
        return ctx

    def _inject(self, ctx: FaultContext, job: TrainingJob, step: int) -> None:
        kind = ctx.fault.kind
        ctx.run_id = job.run_id
        if kind in _CRASHES:
            crash = CrashHooks(kind.value, ctx.plan.point, step, _CRASHES[kind],
                               fault=ctx.fault.to_payload())
            crash.on_step_end(job, step)  # arms the next publish, or dies mid-drain
            self.armed.append(crash)
        elif kind is FaultKind.FREEZE_ENGINE:
            self._freeze_engine(ctx, job)
        elif kind is FaultKind.FREEZE_FOLLOWER:
            self._freeze_follower(ctx, job)
        elif kind is FaultKind.FREEZE_ROLLOUT_MANAGER:
            self._freeze_manager(ctx, job)
        elif kind is FaultKind.KILL_NODE:
            self._lose_node(ctx, job)
        else:
            SCENARIOS[kind.value].inject(ctx, job)

    def _lose_node(self, ctx: FaultContext, job: TrainingJob) -> None:
        """The kill-node drill's removal of the publisher's node; once Ray lists it dead, a
        fresh worker node joins at a later step's end (:meth:`_join_nodes`), so a long
        campaign keeps the cluster's size (a machine replaced, as an operator would)."""
        cluster = ctx.cluster
        if cluster is None or len(cluster.worker_node_ids()) < MIN_WORKER_NODES:
            raise RuntimeError(f"kill-node needs {MIN_WORKER_NODES} worker nodes")
        NODE_SCENARIOS[ctx.fault.kind.value].inject(ctx, job)
        self.nodes_to_replace.append(ctx)

    def _join_nodes(self) -> None:
        """Add a worker node for each lost one Ray has seen dead (the drill's thread noted
        when). On the driver's thread: Ray starts a node only from a process's main thread."""
        for ctx in [c for c in self.nodes_to_replace if "ray_detect_s" in c.record.detail]:
            self.nodes_to_replace.remove(ctx)
            assert ctx.cluster is not None
            joined = ctx.cluster.add_worker_node()
            logger.warning("chaos: node %s lost, node %s joined",
                           str(ctx.record.detail.get("node_id"))[:12], joined[:12])

    def _freeze_engine(self, ctx: FaultContext, job: TrainingJob) -> None:
        """SIGSTOP one engine: the supervisor's probe must find it silent and replace it."""
        engine_id = ctx.rng.choice(sorted(job.supervisor.engines))
        self._freeze(ctx, job, engine_id, lambda: job.supervisor.engines.get(engine_id),
                     engine=engine_id)

    def _freeze_follower(self, ctx: FaultContext, job: TrainingJob) -> None:
        """SIGSTOP one follower cell: the heartbeat must drop it from the quorum (its calls
        time out), and healing must replace it with a copy of a live cell."""
        publisher = job.ledger.head(job.run_id).publisher_cell
        followers = [c for c in job.supervisor.cells.alive_ids() if c != publisher]
        if not followers:
            raise RuntimeError("no live follower to freeze")
        cell_id = ctx.rng.choice(followers)
        self._freeze(ctx, job, cell_id, lambda: job.supervisor.cells.actor(cell_id),
                     cell=cell_id)

    def _freeze_manager(self, ctx: FaultContext, job: TrainingJob) -> None:
        """SIGSTOP the rollout manager: the next drain must find it silent, probe it, and
        replace it from the ledger's prompt account."""
        self._freeze(ctx, job, "rollout-manager", lambda: job.supervisor.manager,
                     manager="rollout-manager")

    def _freeze(self, ctx: FaultContext, job: TrainingJob, actor_id: str,
                current: Callable[[], Any], **detail: Any) -> None:
        """SIGSTOP ``actor_id``'s process and record the fault; a background thread lets the
        process go (SIGCONT) once ``current()`` is another actor (it was replaced, and the
        frozen one killed), or after ``frozen_s`` if it never is."""
        frozen = current()
        pid = actor_pid(frozen)
        os.kill(pid, signal.SIGSTOP)
        ctx.fired(job, pid=pid, **detail)

        def thaw_when_replaced() -> None:
            deadline = time.monotonic() + self.frozen_s
            while current() is frozen and time.monotonic() < deadline:
                time.sleep(0.2)
            ctx.record.detail["replaced"] = current() is not frozen
            logger.warning("chaos: %s %s; letting its process go", actor_id,
                           "replaced" if current() is not frozen else "never replaced")
            with contextlib.suppress(ProcessLookupError):  # killed with its replacement
                os.kill(pid, signal.SIGCONT)
                # The supervisor killed it through Ray; a process that outlives that is a
                # zombie whose late answers the fences must refuse: say so in the log.
                time.sleep(1.0)
                if os.path.exists(f"/proc/{pid}"):
                    logger.warning("chaos: the frozen %s (pid %d) outlived its replacement",
                                   actor_id, pid)

        ctx.background(threading.Thread(target=thaw_when_replaced, name="chaos-thaw",
                                        daemon=True))

    def _each_armed(self, call: Callable[[JobHooks], None]) -> None:
        for hooks in list(self.armed):
            try:
                call(hooks)
            except Exception as exc:  # noqa: BLE001 - a fault's error never ends the run
                logger.warning("chaos: an armed fault failed: %s: %s", type(exc).__name__, exc)
                self.armed.remove(hooks)
