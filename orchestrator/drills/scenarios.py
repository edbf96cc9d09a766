"""The drill scenarios: each names a fault, where it may land, how it is injected, and what
recovery must show on top of the generic checker.

A :class:`Scenario` is ``name``, ``points`` (where in a step the fault lands), ``steps`` (after
which steps it may be injected), ``inject`` (called from the job's ``on_step_end`` hook at the
planned step: it acts at once, or arms a fault primitive on the job's hooks) and ``expect``
(the scenario's own checks over the folded run,
:class:`~orchestrator.drills.checker.DrillRunState`).
Scenarios act only through :class:`~orchestrator.drills.context.DrillContext`, the fault
primitives (:mod:`~orchestrator.drills.faults`, :mod:`~orchestrator.drills.outages`) and the
job's public control plane (``job.supervisor``, ``job.publisher``, ``job.ledger``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from actors.publishing.sequence import UpdatePoint
from ledger import FencedError
from orchestrator.drills.checker import DrillRunState, first_commit_after
from orchestrator.drills.context import DrillContext, StopRun, error_name
from orchestrator.drills.context import DrillPoint as Point
from orchestrator.drills.crash import CRASH_POINTS, expect_prompts_once
from orchestrator.drills.faults import (
    KillAtUpdatePoint,
    MidTrainKill,
    actor_pid,
    frozen,
    kill_and_wait,
    publisher_of,
    zombie_commit,
    zombie_transfer,
)
from orchestrator.drills.outages import database_outage

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = ["SCENARIOS", "Expectation", "Injection", "Scenario"]

Injection = Callable[[DrillContext, "TrainingJob"], None]
Expectation = Callable[[DrillContext, "TrainingJob | None", DrillRunState], list[str]]


@dataclass(frozen=True)
class Scenario:
    """A fault, where it may land, and what recovery must look like afterwards."""

    name: str
    points: tuple[str, ...]
    steps: tuple[int, ...]
    inject: Injection
    expect: Expectation
    num_cells: int = 2
    crash: str | None = None  # "driver" or "everything": the whole job dies (drills.crash)


# ------------------------------------------------------------------------ publisher deaths

# A drill point inside a weight update -> the named point of THE update sequence it kills at.
UPDATE_KILL_POINTS: dict[Point, UpdatePoint] = {
    Point.MID_TRANSFER: UpdatePoint.MID_TRANSFER,
    Point.BEFORE_COMMIT: UpdatePoint.AFTER_TRANSFER,
    Point.BEFORE_STAMP: UpdatePoint.AFTER_COMMIT,
}


def _kill_publisher(ctx: DrillContext, job: TrainingJob) -> None:
    """Arm the kill that lands at the planned point of the next step."""
    if ctx.plan.point == Point.MID_TRAIN:
        ctx.arm(MidTrainKill(ctx, publisher_of(job)))
    else:
        ctx.arm(KillAtUpdatePoint(ctx, UPDATE_KILL_POINTS[ctx.plan.point]))


def _expect_failover(ctx: DrillContext, job: TrainingJob | None,
                     state: DrillRunState) -> list[str]:
    problems = _expect_promotions(ctx, state, 1)
    detail = ctx.record.detail
    if not detail.get("during_train_step", True):
        problems.append("the kill landed after the training step, not during it")
    if ctx.plan.point == Point.BEFORE_STAMP:
        committed = detail.get("committed")
        if committed not in state.unstamped_versions:
            problems.append(f"v{committed} (committed, never stamped) is not audited unstamped")
    if detail.get("cell") is not None:
        problems += _expect_healed(ctx, state, [detail["cell"]])
    return problems


def _zombie_publisher(ctx: DrillContext, job: TrainingJob) -> None:
    """SIGSTOP the publisher; fail over by heartbeat timeout; let the successor publish (so
    engines learn the new epoch); SIGCONT the zombie and have it, at its old epoch, run the
    whole update sequence, and (inside its own process) the sequence's commit step and its
    stage-and-load steps. All three must be refused and change nothing. Healing (which kills
    the zombie) is left to the driver's next step."""
    # A zombie is frozen idle: its last update's tail (stamps, engines_stamped) ends first.
    # Frozen inside that tail's ledger write, it would hold the SQLite write lock and stop
    # the run, as a publisher frozen inside any ledger write would.
    job.publisher.settle()
    zombie = publisher_of(job)
    engines = list(job.supervisor.engines.values())
    with frozen(zombie.pid):
        ctx.fired(job, cell=zombie.cell_id, epoch=zombie.epoch, pid=zombie.pid)
        started = time.monotonic()
        lost = job.supervisor.check_cells()
        detect_s = time.monotonic() - started
        new_epoch = job.ledger.head(job.run_id).epoch
        job.publisher.publish_weights()
        job.publisher.settle()  # the successor's engines_stamped is in before the head is read
    head = job.ledger.head(job.run_id)
    engine_state = _engine_state(engines)
    attempts = {
        "commit": zombie.actor.__ray_call__.remote(zombie_commit, zombie.epoch),
        "update_weights": zombie.actor.update_weights.remote(engines, zombie.epoch),
        "transfer": zombie.actor.__ray_call__.remote(zombie_transfer, engines, zombie.epoch),
    }
    refused = {}
    for name, ref in attempts.items():
        try:
            ray.get(ref, timeout=60)
            refused[name] = "accepted"
        except FencedError:
            refused[name] = "FencedError"
        except Exception as exc:  # noqa: BLE001 - the kind of refusal is what is checked
            refused[name] = error_name(exc)
    ctx.record.detail.update({
        "lost_by_heartbeat": lost, "heartbeat_detect_s": round(detect_s, 3),
        "new_epoch": new_epoch, "zombie_attempts": refused,
        "head_unchanged": job.ledger.head(job.run_id) == head,
        "engines_unchanged": _engine_state(engines) == engine_state,
    })


def _expect_fenced(ctx: DrillContext, job: TrainingJob | None,
                   state: DrillRunState) -> list[str]:
    detail = ctx.record.detail
    problems = _expect_promotions(ctx, state, 1)
    if detail.get("cell") not in detail.get("lost_by_heartbeat", []):
        problems.append("the frozen publisher was not detected by the heartbeat timeout")
    # update_weights may be refused by the engines rather than the ledger: its started event
    # has the same idempotency key as the zombie's last update, so the ledger returns the
    # stored one (writes nothing) and the engines, at the new epoch, refuse the pause.
    expected = {"commit": {"FencedError"}, "update_weights": {"FencedError", "StaleEpochError"},
                "transfer": {"StaleEpochError"}}
    attempts = detail.get("zombie_attempts", {})
    for name, refusals in expected.items():
        if attempts.get(name) not in refusals:
            problems.append(f"zombie {name}: {attempts.get(name)}, expected one of "
                            f"{sorted(refusals)}")
    if not detail.get("head_unchanged"):
        problems.append("the ledger head changed while the zombie wrote")
    if not detail.get("engines_unchanged"):
        problems.append("engine weights or labels changed while the zombie wrote")
    return problems + _expect_healed(ctx, state, [detail.get("cell")])


def _double_failover(ctx: DrillContext, job: TrainingJob) -> None:
    """Kill the publisher, let the supervisor promote a successor, and kill that one right
    after its promotion (before it publishes anything: Kafka KIP-101's double failure)."""
    first = publisher_of(job)
    detect_s = kill_and_wait(first.actor, first.pid)
    ctx.fired(job, cell=first.cell_id, epoch=first.epoch, ray_detect_s=round(detect_s, 3))
    job.supervisor.check_cells()
    second = publisher_of(job)
    kill_and_wait(second.actor, second.pid)
    ctx.record.detail.update({"second": second.cell_id, "second_epoch": second.epoch})


def _expect_double_failover(ctx: DrillContext, job: TrainingJob | None,
                            state: DrillRunState) -> list[str]:
    detail = ctx.record.detail
    return _expect_promotions(ctx, state, 2) + _expect_healed(
        ctx, state, [detail.get("cell"), detail.get("second")])


# ------------------------------------------------------------------------ other processes

def _kill_follower(ctx: DrillContext, job: TrainingJob) -> None:
    publisher = job.ledger.head(job.run_id).publisher_cell
    followers = [c for c in job.supervisor.cells.alive_ids() if c != publisher]
    cell_id = ctx.rng.choice(followers)
    actor = job.supervisor.cells.actor(cell_id)
    ctx.fired(job, cell=cell_id, ray_detect_s=round(kill_and_wait(actor, actor_pid(actor)), 3))


def _expect_follower_healed(ctx: DrillContext, job: TrainingJob | None,
                            state: DrillRunState) -> list[str]:
    return _expect_healed(ctx, state, [ctx.record.detail.get("cell")])


def _kill_engine(ctx: DrillContext, job: TrainingJob) -> None:
    engines = job.supervisor.engines
    engine_id = ctx.rng.choice(sorted(engines))
    engine = engines[engine_id]
    ctx.fired(job, engine=engine_id,
              ray_detect_s=round(kill_and_wait(engine, actor_pid(engine)), 3))


def _expect_engine_replaced(ctx: DrillContext, job: TrainingJob | None,
                            state: DrillRunState) -> list[str]:
    if job is None:
        return []
    restarts = job.supervisor.counters.engine_restarts
    problems = []
    if restarts < 1:
        problems.append("the dead engine was never restarted")
    versions = {e: h["version"] for e, h in _engine_health(job.supervisor.engines).items()}
    if any(v != state.head_version for v in versions.values()):
        problems.append(f"engines at versions {versions} at the end, "
                        f"head is v{state.head_version}")
    ctx.record.detail["engine_restarts"] = restarts
    return problems


def _kill_rollout_manager(ctx: DrillContext, job: TrainingJob) -> None:
    manager = job.supervisor.manager
    ctx.fired(job, ray_detect_s=round(kill_and_wait(manager, actor_pid(manager)), 3))


def _expect_manager_replaced(ctx: DrillContext, job: TrainingJob | None,
                             state: DrillRunState) -> list[str]:
    if job is None:
        return []
    replacements = job.supervisor.counters.manager_replacements
    problems = []
    if replacements < 1:
        problems.append("the dead rollout manager was never replaced")
    version = ray.get(job.supervisor.manager.get_weight_version.remote())
    if version > state.head_version:
        problems.append(f"the new manager's version {version} is above the ledger head")
    ctx.record.detail["manager_replacements"] = replacements
    return problems


# ------------------------------------------------------------------------ database, stop

def _database_outage(ctx: DrillContext, job: TrainingJob) -> None:
    """Stop PostgreSQL (or hold the SQLite file's write lock) for ``hold_s``; the restart runs
    on a thread so the run's writers meet the outage and must wait and retry. The fault is
    recorded in the ledger once the database is back."""
    head = job.ledger.head(job.run_id)
    outage = database_outage(ctx.ledger_url, ctx.plan.hold_s)
    outage.begin()
    ctx.record.mark_fired(head, backend=job.ledger.backend, hold_s=ctx.plan.hold_s)

    def end_outage() -> None:
        try:
            outage.end()
        finally:
            ctx.record.detail["outage_s"] = round(outage.seconds, 2)
            ctx.record_fault_event()

    ctx.background(threading.Thread(target=end_outage, name="drill-restart", daemon=True))


def _expect_writes_resumed(ctx: DrillContext, job: TrainingJob | None,
                           state: DrillRunState) -> list[str]:
    if state.head_version <= ctx.record.version_before:
        return ["nothing was committed after the outage"]
    return []


def _stop_run(ctx: DrillContext, job: TrainingJob) -> None:
    ctx.fired(job, stopped_after_step=job.step + 1)
    raise StopRun(f"drill stops {job.run_id} after step {job.step + 1}")


def _expect_resumed(ctx: DrillContext, job: TrainingJob | None,
                    state: DrillRunState) -> list[str]:
    if not state.resumed:
        return ["no run_resumed event"]
    resumed = state.resumed[0]
    payload = resumed.payload
    ctx.record.detail["run_resumed"] = payload
    problems = []
    if payload["checkpoint_version"] >= payload["head_version"]:
        problems.append(f"the checkpoint (v{payload['checkpoint_version']}) was not older than "
                        f"the head (v{payload['head_version']})")
    commit = first_commit_after(state, resumed.seq)
    if commit is None or commit.version != payload["head_version"] + 1:
        got = None if commit is None else commit.version
        problems.append(f"first commit after resume is v{got}, not head + 1 = "
                        f"v{payload['head_version'] + 1}")
    return problems


# ------------------------------------------------------------------------ whole-job crashes

def _crash_in_child(ctx: DrillContext, job: TrainingJob) -> None:
    """Never called: a whole-job crash is injected inside the child job (drills.crash)."""
    raise AssertionError("whole-job crashes run through orchestrator.drills.crash")


def _expect_crash_recovered(ctx: DrillContext, job: TrainingJob | None,
                            state: DrillRunState) -> list[str]:
    """The resume fenced the crashed job and continued from the head at its promotion.

    Between the fault and the resume's promotion the crashed job's surviving actors may still
    commit (a publisher finishing its update after the driver died): legal, at the old epoch,
    and below the resume's first version. So the first commit after ``run_resumed`` is its
    recorded ``head_version + 1``, not the head seen at the fault + 1.
    """
    problems = []
    resumes = [p for p in state.promotions
               if p.seq > ctx.record.seq_at_fault and p.reason == "resume"]
    old_epoch = max((p.epoch for p in state.promotions if p.seq <= ctx.record.seq_at_fault),
                    default=0)
    resumed = [e for e in state.resumed if e.seq > ctx.record.seq_at_fault]
    if not resumes:
        problems.append("no cell_promoted reason=resume after the crash")
    elif resumes[0].epoch <= old_epoch:
        problems.append("the resume did not take a new epoch")
    elif not resumed:
        problems.append("no run_resumed after the crash")
    else:
        promotion, resume = resumes[0], resumed[0]
        head_at_promotion = int(resume.payload["head_version"])
        late = [c for c in state.commits.values()
                if ctx.record.seq_at_fault < c.seq < promotion.seq]
        problems += [f"v{c.version} committed after the crash at epoch {c.epoch}, not the "
                     f"crashed job's {old_epoch}" for c in late if c.epoch != old_epoch]
        if head_at_promotion != ctx.record.version_before + len(late):
            problems.append(f"run_resumed records head v{head_at_promotion}, but the ledger "
                            f"held v{ctx.record.version_before + len(late)} at the promotion")
        commit = first_commit_after(state, resume.seq)
        if commit is not None and commit.version != head_at_promotion + 1:
            problems.append(f"first version after the resume is v{commit.version}, "
                            f"expected v{head_at_promotion + 1}")
        problems += [f"v{c.version} committed after the resume at epoch {c.epoch}, below the "
                     f"resume's {promotion.epoch}" for c in state.commits.values()
                     if c.seq > promotion.seq and (c.epoch or 0) < promotion.epoch]
    return problems + expect_prompts_once(ctx.ledger, ctx.run_id)


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        Scenario("kill-publisher-mid-train", (Point.MID_TRAIN,), (1, 2, 3), _kill_publisher,
                 _expect_failover),
        Scenario("kill-publisher-mid-transfer", (Point.MID_TRANSFER, Point.BEFORE_COMMIT),
                 (1, 2, 3), _kill_publisher, _expect_failover),
        Scenario("kill-publisher-after-commit", (Point.BEFORE_STAMP,), (1, 2, 3),
                 _kill_publisher, _expect_failover),
        Scenario("zombie-publisher", (Point.FROZEN,), (1, 2, 3), _zombie_publisher,
                 _expect_fenced),
        Scenario("double-failover", (Point.AFTER_PROMOTION,), (1, 2, 3), _double_failover,
                 _expect_double_failover, num_cells=3),
        Scenario("kill-follower", (Point.BETWEEN_STEPS,), (1, 2, 3), _kill_follower,
                 _expect_follower_healed),
        Scenario("kill-engine", (Point.BETWEEN_STEPS,), (1, 2, 3), _kill_engine,
                 _expect_engine_replaced),
        Scenario("kill-rollout-manager", (Point.BETWEEN_STEPS,), (1, 2, 3),
                 _kill_rollout_manager, _expect_manager_replaced),
        Scenario("database-outage", (Point.BETWEEN_STEPS,), (1, 2, 3), _database_outage,
                 _expect_writes_resumed),
        # Stop after an odd step count, so the newest checkpoint (every 2 steps) is older
        # than the head.
        Scenario("resume-from-old-checkpoint", (Point.STOP,), (2, 4), _stop_run,
                 _expect_resumed),
        Scenario("kill-driver", CRASH_POINTS, (1, 2, 3), _crash_in_child, _expect_crash_recovered,
                 crash="driver"),
        Scenario("kill-everything", CRASH_POINTS, (1, 2, 3), _crash_in_child,
                 _expect_crash_recovered, crash="everything"),
    )
}


# ------------------------------------------------------------------------ shared checks

def _expect_promotions(ctx: DrillContext, state: DrillRunState, count: int) -> list[str]:
    promotions = state.promotions_since(ctx.record.seq_at_fault)
    if promotions < count:
        return [f"{promotions} promotions after the fault, expected at least {count}"]
    return []


def _expect_healed(ctx: DrillContext, state: DrillRunState,
                   cell_ids: list[str | None]) -> list[str]:
    healed = state.healed_since(ctx.record.seq_at_fault)
    missing = [c for c in cell_ids if c is not None and c not in healed]
    return [f"cells {missing} were never healed"] if missing else []


def _engine_health(engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(zip(engines, ray.get([e.health.remote() for e in engines.values()])))


def _engine_state(engines: list[Any]) -> list[tuple[Any, ...]]:
    health = ray.get([e.health.remote() for e in engines])
    checksums = ray.get([e.weights_checksum.remote() for e in engines])
    return [(h["version"], h["epoch"], c) for h, c in zip(health, checksums)]
