"""Recovery drills: real faults injected into a real short run, then a check of DESIGN section 4.

Modelled on Jepsen (a nemesis acts on real processes while a workload runs, then a checker
judges the recorded history) and on etcd's robustness tests (failpoints before and after the
commit). Each drill:

1. declares its schedule up front as a :class:`FaultPlan` (scenario, step, point), recorded in
   a ``drill_started`` event before the run trains;
2. runs a short fully-async job (Ray cells, engines, rollout manager, the ledger) whose
   ``on_step`` hook lets the nemesis act *from outside* at the planned step: SIGKILL/SIGSTOP of
   the real worker processes, the database server stopped or its file locked, the job stopped
   and resumed. Where a fault must land between the publisher's update steps the nemesis drives
   the publisher's public ``begin_update`` / ``transfer`` / ``commit`` itself, then kills it; no
   production class carries a fault hook;
3. records that the fault really fired (``fault_injected``, with the head at that moment): a
   drill whose fault did not fire fails, so no drill passes by not injecting;
4. lets the run recover and go on for a few steps, then judges the history with
   :func:`orchestrator.checker.check_run` plus the scenario's own expectations, and records
   ``drill_verdict``.

A run that does not finish within ``deadline_s`` (a recovery that never comes) fails too: its
actors are killed so the drill returns.

``plan_drills(..., seed, repeat)`` draws steps and points at random (chaos mode), reproducibly.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from ledger import FencedError, Ledger
from orchestrator import launch
from orchestrator.checker import check_run, first_commit_after, seconds_between
from orchestrator.config import RunConfig
from orchestrator.driver import JobOptions, TrainingJob

__all__ = [
    "SCENARIOS",
    "DrillError",
    "DrillOptions",
    "DrillResult",
    "FaultPlan",
    "plan_drills",
    "run_drill",
    "run_drills",
]

logger = logging.getLogger(__name__)

RECOVER_STEPS = 3  # steps the run trains after the fault
DRILL_HEARTBEAT_S = 3.0  # small, so a frozen publisher is failed over quickly
PG_CLUSTER_NAME = "main"


class DrillError(ValueError):
    """A drill that cannot be run as asked (unknown scenario, no local PostgreSQL): one line."""


@dataclass(frozen=True)
class FaultPlan:
    """The declared schedule of one drill.

    ``step`` is the 0-based step after which the nemesis acts (``mid-train`` lands inside the
    next step's training). ``delay_s`` is how far into that training step; ``hold_s`` is how
    long a database outage lasts.
    """

    scenario: str
    step: int
    point: str
    delay_s: float = 0.02
    hold_s: float = 5.0


@dataclass
class FaultRecord:
    """What the nemesis really did (``fired`` stays False if it never acted)."""

    fired: bool = False
    fired_at: datetime | None = None  # naive UTC, like the ledger's recorded_at
    seq_at_fault: int = 0
    version_before: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass
class DrillResult:
    """One drill's verdict and the numbers of the verdict table."""

    plan: FaultPlan
    run_id: str
    ledger_url: str
    passed: bool
    recover_s: float | None
    version_before: int
    version_after: int
    negative_staleness: int | None
    groups_lost: int | None
    problems: list[str]
    wall_s: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DrillOptions:
    """Where and how drills run.

    ``db`` None gives every drill its own SQLite file under ``runs_dir``. ``job_class`` lets a
    test plant a broken recovery (a TrainingJob subclass) and see the verdict go red.
    """

    runs_dir: Path = Path("runs/drills")
    db: str | None = None
    seed: int = 1234
    recover_steps: int = RECOVER_STEPS
    deadline_s: float = 240.0
    ray_address: str | None = None
    job_class: type[TrainingJob] = TrainingJob


# ---------------------------------------------------------------------------------- scenarios

Nemesis = Callable[["_Drill", TrainingJob], None]
Expectation = Callable[["_Drill", TrainingJob | None], list[str]]


@dataclass(frozen=True)
class Scenario:
    """A fault, where it may land, and what recovery must look like afterwards."""

    name: str
    points: tuple[str, ...]
    steps: tuple[int, ...]
    inject: Nemesis
    expect: Expectation
    num_cells: int = 2


def _actor_pid(actor_self: Any) -> int:
    return os.getpid()


def _pid(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(_actor_pid), timeout=60))


def kill_and_wait(actor: Any, pid: int, timeout_s: float = 30.0) -> float:
    """SIGKILL ``pid`` (the actor's worker) and wait until a call on ``actor`` raises Ray's
    actor-death error. Returns the seconds from the signal to that error.

    Raises:
        TimeoutError: Ray did not report the actor dead within ``timeout_s``.
    """
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while time.monotonic() - started < timeout_s:
        try:
            ray.get(actor.__ray_call__.remote(_actor_pid), timeout=timeout_s)
        except RayActorError:
            return time.monotonic() - started
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.01)
    raise TimeoutError(f"actor of pid {pid} not reported dead within {timeout_s:g}s")


def _publisher(job: TrainingJob) -> tuple[str, int, Any]:
    head = job.ledger.head(job.run_id)
    return head.publisher_cell, head.epoch, job.cells.actor(head.publisher_cell)


def _kill_publisher_between_update_steps(drill: _Drill, job: TrainingJob) -> None:
    """Arm a one-shot wrapper on this job's CellGroup: the next weight update is driven by
    hand through the publisher's public steps up to the planned point (after ``transfer``, or
    after ``commit``), the publisher is SIGKILLed, and the group's own ``update_weights`` then
    runs and must fail over."""
    cells = job.cells
    original = cells.update_weights

    def update_weights_with_fault(engines, rollout_manager=None):
        cells.update_weights = original  # one shot
        cell_id, epoch, actor = _publisher(job)
        pid = _pid(actor)
        engines = list(engines)
        ray.get(actor.begin_update.remote(engines, epoch, job.ledger_url, job.run_id))
        checksum = ray.get(actor.transfer.remote(engines, epoch))
        detail: dict[str, Any] = {"cell": cell_id, "epoch": epoch, "pid": pid}
        if drill.plan.point == "before-stamp":
            detail["committed"] = ray.get(
                actor.commit.remote(job.ledger_url, job.run_id, epoch, checksum))
        drill.fired(job, **detail, ray_detect_s=round(kill_and_wait(actor, pid), 3))
        return original(engines, rollout_manager)

    cells.update_weights = update_weights_with_fault


def _kill_publisher_mid_train(drill: _Drill, job: TrainingJob) -> None:
    """Arm a one-shot wrapper on this job's CellGroup: the next training step SIGKILLs the
    publisher ``delay_s`` after it starts (the group's own code is untouched)."""
    cell_id, epoch, actor = _publisher(job)
    pid = _pid(actor)
    cells = job.cells
    original = cells.train_step
    in_step = threading.Event()

    def kill_soon() -> None:
        time.sleep(drill.plan.delay_s)
        during = in_step.is_set()
        os.kill(pid, signal.SIGKILL)
        drill.fired(job, cell=cell_id, epoch=epoch, pid=pid, during_train_step=during)

    def train_step_with_fault(groups):
        cells.train_step = original  # one shot
        killer = threading.Thread(target=kill_soon, name="drill-nemesis", daemon=True)
        in_step.set()
        killer.start()
        try:
            return original(groups)
        finally:
            in_step.clear()
            killer.join()

    cells.train_step = train_step_with_fault


def _kill_publisher(drill: _Drill, job: TrainingJob) -> None:
    if drill.plan.point == "mid-train":
        _kill_publisher_mid_train(drill, job)
    else:
        _kill_publisher_between_update_steps(drill, job)


def _expect_failover(drill: _Drill, job: TrainingJob | None) -> list[str]:
    problems = _expect_promotions(drill, 1)
    killed = drill.record.detail.get("cell")
    if not drill.record.detail.get("during_train_step", True):
        problems.append("the kill landed after the training step, not during it")
    if drill.plan.point == "before-stamp":
        committed = drill.record.detail.get("committed")
        if committed not in drill.report.unstamped_versions:
            problems.append(f"v{committed} (committed, never stamped) is not audited unstamped")
    if killed is not None:
        problems += _expect_healed(drill, [killed])
    return problems


def _zombie_publisher(drill: _Drill, job: TrainingJob) -> None:
    """SIGSTOP the publisher; fail over by heartbeat timeout; let the successor publish (so
    engines learn the new epoch); SIGCONT the zombie and have it try to commit, to begin an
    update and to transfer at its old epoch. All three must be refused and change nothing.
    Healing (which kills the zombie) is left to the driver's next step."""
    cell_id, epoch, zombie = _publisher(job)
    pid = _pid(zombie)
    engines = list(job.engines.values())
    os.kill(pid, signal.SIGSTOP)
    try:
        drill.fired(job, cell=cell_id, epoch=epoch, pid=pid)
        started = time.monotonic()
        lost = job.cells.check_liveness()
        detect_s = time.monotonic() - started
        new_epoch = job.cells.ensure_publisher()
        job.cells.reform()
        job.cells.update_weights(engines, job.manager)
    finally:
        os.kill(pid, signal.SIGCONT)
    head = job.ledger.head(job.run_id)
    engine_state = _engine_state(engines)
    attempts = {
        "commit": zombie.commit.remote(job.ledger_url, job.run_id, epoch, "0" * 64),
        "begin_update": zombie.begin_update.remote(engines, epoch, job.ledger_url, job.run_id),
        "transfer": zombie.transfer.remote(engines, epoch),
    }
    refused = {}
    for name, ref in attempts.items():
        try:
            ray.get(ref, timeout=60)
            refused[name] = "accepted"
        except FencedError:
            refused[name] = "FencedError"
        except Exception as exc:  # noqa: BLE001 - the kind of refusal is what is checked
            refused[name] = _error_name(exc)
    drill.record.detail.update({
        "lost_by_heartbeat": lost, "heartbeat_detect_s": round(detect_s, 3),
        "new_epoch": new_epoch, "zombie_attempts": refused,
        "head_unchanged": job.ledger.head(job.run_id) == head,
        "engines_unchanged": _engine_state(engines) == engine_state,
    })


def _expect_fenced(drill: _Drill, job: TrainingJob | None) -> list[str]:
    detail = drill.record.detail
    problems = _expect_promotions(drill, 1)
    if detail.get("cell") not in detail.get("lost_by_heartbeat", []):
        problems.append("the frozen publisher was not detected by the heartbeat timeout")
    # begin_update may be refused by the engines rather than the ledger: its event has the
    # same idempotency key as the zombie's last update, so the ledger returns the stored one
    # (writes nothing) and the engines, at the new epoch, refuse the pause.
    expected = {"commit": {"FencedError"}, "begin_update": {"FencedError", "StaleEpochError"},
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
    return problems + _expect_healed(drill, [detail.get("cell")])


def _double_failover(drill: _Drill, job: TrainingJob) -> None:
    """Kill the publisher, let the group promote a successor, and kill that one right after
    its promotion (before it publishes anything: Kafka KIP-101's double failure)."""
    cell_id, epoch, actor = _publisher(job)
    detect_s = kill_and_wait(actor, _pid(actor))
    drill.fired(job, cell=cell_id, epoch=epoch, ray_detect_s=round(detect_s, 3))
    job.cells.check_liveness()
    second_epoch = job.cells.ensure_publisher()
    second = job.ledger.head(job.run_id).publisher_cell
    successor = job.cells.actor(second)
    kill_and_wait(successor, _pid(successor))
    drill.record.detail.update({"second": second, "second_epoch": second_epoch})


def _expect_double_failover(drill: _Drill, job: TrainingJob | None) -> list[str]:
    detail = drill.record.detail
    return _expect_promotions(drill, 2) + _expect_healed(drill, [detail.get("cell"),
                                                                  detail.get("second")])


def _kill_follower(drill: _Drill, job: TrainingJob) -> None:
    publisher = job.ledger.head(job.run_id).publisher_cell
    followers = [c for c in job.cells.alive_ids() if c != publisher]
    cell_id = drill.rng.choice(followers)
    actor = job.cells.actor(cell_id)
    drill.fired(job, cell=cell_id, ray_detect_s=round(kill_and_wait(actor, _pid(actor)), 3))


def _expect_follower_healed(drill: _Drill, job: TrainingJob | None) -> list[str]:
    return _expect_healed(drill, [drill.record.detail.get("cell")])


def _kill_engine(drill: _Drill, job: TrainingJob) -> None:
    engine_id = drill.rng.choice(sorted(job.engines))
    engine = job.engines[engine_id]
    drill.fired(job, engine=engine_id,
                ray_detect_s=round(kill_and_wait(engine, _pid(engine)), 3))


def _expect_engine_replaced(drill: _Drill, job: TrainingJob | None) -> list[str]:
    if job is None:
        return []
    problems = []
    if job.engine_restarts < 1:
        problems.append("the dead engine was never restarted")
    head = drill.report.head_version
    versions = {e: h["version"] for e, h in _engine_health(job.engines).items()}
    if any(v != head for v in versions.values()):
        problems.append(f"engines at versions {versions} at the end, head is v{head}")
    drill.record.detail["engine_restarts"] = job.engine_restarts
    return problems


def _kill_rollout_manager(drill: _Drill, job: TrainingJob) -> None:
    drill.fired(job, ray_detect_s=round(kill_and_wait(job.manager, _pid(job.manager)), 3))


def _expect_manager_replaced(drill: _Drill, job: TrainingJob | None) -> list[str]:
    if job is None:
        return []
    problems = []
    if job.manager_replacements < 1:
        problems.append("the dead rollout manager was never replaced")
    version = ray.get(job.manager.get_weight_version.remote())
    if version > drill.report.head_version:
        problems.append(f"the new manager's version {version} is above the ledger head")
    drill.record.detail["manager_replacements"] = job.manager_replacements
    return problems


def _database_outage(drill: _Drill, job: TrainingJob) -> None:
    """Stop PostgreSQL (or hold the SQLite file's write lock) for ``hold_s``; the restart runs
    on a thread so the run's writers meet the outage and must wait and retry."""
    head = job.ledger.head(job.run_id)
    if job.ledger.backend == "postgresql":
        outage = _PostgresOutage(drill.plan.hold_s)
    else:
        outage = _SqliteLock(Path(drill.ledger_url.split("///", 1)[1]), drill.plan.hold_s)
    outage.begin()
    drill.record.fired = True
    drill.record.fired_at = _utcnow_naive()
    drill.record.seq_at_fault, drill.record.version_before = head.seq, head.version
    drill.record.detail.update({"backend": job.ledger.backend, "hold_s": drill.plan.hold_s})

    def end_outage() -> None:
        try:
            outage.end()
        finally:
            drill.record.detail["outage_s"] = round(outage.seconds, 2)
            drill.record_fault_event()

    drill.background(threading.Thread(target=end_outage, name="drill-restart", daemon=True))


def _expect_writes_resumed(drill: _Drill, job: TrainingJob | None) -> list[str]:
    if drill.report.head_version <= drill.record.version_before:
        return ["nothing was committed after the outage"]
    return []


class _StopRun(Exception):
    """Raised from the drill's hook to stop the first half of resume-from-old-checkpoint."""


def _stop_run(drill: _Drill, job: TrainingJob) -> None:
    drill.fired(job, stopped_after_step=job.step + 1)
    raise _StopRun(f"drill stops {job.run_id} after step {job.step + 1}")


def _expect_resumed(drill: _Drill, job: TrainingJob | None) -> list[str]:
    resumed = [e for e in drill.ledger.events(drill.run_id) if e.kind == "run_resumed"]
    if not resumed:
        return ["no run_resumed event"]
    payload = resumed[0].payload
    drill.record.detail["run_resumed"] = payload
    problems = []
    if payload["checkpoint_version"] >= payload["head_version"]:
        problems.append(f"the checkpoint (v{payload['checkpoint_version']}) was not older than "
                        f"the head (v{payload['head_version']})")
    commit = first_commit_after(drill.ledger, drill.run_id, resumed[0].seq)
    if commit is None or commit.version != payload["head_version"] + 1:
        got = None if commit is None else commit.version
        problems.append(f"first commit after resume is v{got}, not head + 1 = "
                        f"v{payload['head_version'] + 1}")
    return problems


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        Scenario("kill-publisher-mid-train", ("mid-train",), (1, 2, 3), _kill_publisher,
                 _expect_failover),
        Scenario("kill-publisher-mid-transfer", ("before-commit",), (1, 2, 3), _kill_publisher,
                 _expect_failover),
        Scenario("kill-publisher-after-commit", ("before-stamp",), (1, 2, 3), _kill_publisher,
                 _expect_failover),
        Scenario("zombie-publisher", ("frozen",), (1, 2, 3), _zombie_publisher,
                 _expect_fenced),
        Scenario("double-failover", ("after-promotion",), (1, 2, 3), _double_failover,
                 _expect_double_failover, num_cells=3),
        Scenario("kill-follower", ("between-steps",), (1, 2, 3), _kill_follower,
                 _expect_follower_healed),
        Scenario("kill-engine", ("between-steps",), (1, 2, 3), _kill_engine,
                 _expect_engine_replaced),
        Scenario("kill-rollout-manager", ("between-steps",), (1, 2, 3), _kill_rollout_manager,
                 _expect_manager_replaced),
        Scenario("database-outage", ("between-steps",), (1, 2, 3), _database_outage,
                 _expect_writes_resumed),
        # Stop after an odd step count, so the newest checkpoint (every 2 steps) is older
        # than the head.
        Scenario("resume-from-old-checkpoint", ("stop",), (2, 4), _stop_run, _expect_resumed),
    )
}


# ---------------------------------------------------------------------------------- helpers

def _expect_promotions(drill: _Drill, count: int) -> list[str]:
    promotions = [e for e in drill.ledger.events(drill.run_id, start_seq=drill.record.seq_at_fault)
                  if e.kind == "cell_promoted"]
    if len(promotions) < count:
        return [f"{len(promotions)} promotions after the fault, expected at least {count}"]
    return []


def _expect_healed(drill: _Drill, cell_ids: list[str | None]) -> list[str]:
    healed = {e.cell_id for e in drill.ledger.events(drill.run_id,
                                                     start_seq=drill.record.seq_at_fault)
              if e.kind == "cell_state" and e.payload.get("state") == "healed"}
    missing = [c for c in cell_ids if c is not None and c not in healed]
    return [f"cells {missing} were never healed"] if missing else []


def _engine_health(engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(zip(engines, ray.get([e.health.remote() for e in engines.values()])))


def _engine_state(engines: list[Any]) -> list[tuple[Any, ...]]:
    health = ray.get([e.health.remote() for e in engines])
    checksums = ray.get([e.weights_checksum.remote() for e in engines])
    return [(h["version"], h["epoch"], c) for h, c in zip(health, checksums)]


def _error_name(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if cause is not None else type(exc).__name__


def _utcnow_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class _PostgresOutage:
    """Stop the local PostgreSQL cluster, and start it again ``hold_s`` later."""

    def __init__(self, hold_s: float) -> None:
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        if not versions:
            raise DrillError("database-outage on PostgreSQL needs a local cluster "
                             "(/etc/postgresql); none found")
        self.version = versions[-1]
        self.hold_s = hold_s
        self.seconds = 0.0
        self._started = 0.0

    def _ctl(self, action: str) -> None:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", self.version,
                        PG_CLUSTER_NAME, action], check=True, capture_output=True, timeout=120)

    def begin(self) -> None:
        self._ctl("stop")
        self._started = time.monotonic()
        if subprocess.run(["pg_isready", "-h", "127.0.0.1"], capture_output=True).returncode == 0:
            raise DrillError("PostgreSQL still answers after pg_ctlcluster stop")

    def end(self) -> None:
        try:
            time.sleep(max(0.0, self.hold_s - (time.monotonic() - self._started)))
        finally:
            self._ctl("start")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and subprocess.run(
                    ["pg_isready", "-h", "127.0.0.1"], capture_output=True).returncode != 0:
                time.sleep(0.2)
            self.seconds = time.monotonic() - self._started


class _SqliteLock:
    """Another process holds the SQLite file's write lock (``BEGIN EXCLUSIVE``) for
    ``hold_s``: the run's writers wait on the busy timeout, then retry."""

    def __init__(self, path: Path, hold_s: float) -> None:
        self.path, self.hold_s, self.seconds = path, hold_s, 0.0
        self._process: subprocess.Popen[str] | None = None
        self._started = 0.0

    def begin(self) -> None:
        script = ("import sqlite3, sys, time\n"
                  "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n"
                  "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\n"
                  "time.sleep(float(sys.argv[2]))\nc.execute('COMMIT')\n")
        self._process = subprocess.Popen([sys.executable, "-c", script, str(self.path),
                                          str(self.hold_s)], stdout=subprocess.PIPE, text=True)
        if self._process.stdout.readline().strip() != "locked":
            raise DrillError(f"could not lock {self.path}")
        self._started = time.monotonic()

    def end(self) -> None:
        assert self._process is not None
        self._process.wait(timeout=self.hold_s + 120)
        self.seconds = time.monotonic() - self._started


# ---------------------------------------------------------------------------------- running

class _Drill:
    """One drill's state: its plan, run, ledger handle, and what the nemesis recorded."""

    def __init__(self, plan: FaultPlan, scenario: Scenario, options: DrillOptions) -> None:
        self.plan = plan
        self.scenario = scenario
        self.options = options
        self.rng = random.Random(f"{options.seed}:{plan}")
        self.run_id = (f"drill-{plan.scenario}-{datetime.now(UTC):%Y%m%d-%H%M%S}-"
                       f"{secrets.token_hex(2)}")
        self.run_dir = Path(options.runs_dir) / self.run_id
        self.ledger_url = options.db or f"sqlite:///{self.run_dir / 'ledger.db'}"
        self.record = FaultRecord()
        self.report: Any = None
        self.ledger: Ledger | None = None
        self._threads: list[threading.Thread] = []

    def config(self) -> RunConfig:
        return RunConfig(
            run_id=self.run_id, db=self.ledger_url, rollout_batch_size=4,
            n_samples_per_prompt=4, async_max_concurrent_samples=4,
            num_rollout=self.plan.step + 1 + self.options.recover_steps,
            num_cells=self.scenario.num_cells, num_engines=2, save_interval=2,
            heartbeat_timeout_s=DRILL_HEARTBEAT_S, seed=self.options.seed,
        )

    def fired(self, job: TrainingJob, **detail: Any) -> None:
        """Record that the fault fired now (head and time) and append ``fault_injected``."""
        head = job.ledger.head(job.run_id)
        self.record.fired = True
        self.record.fired_at = _utcnow_naive()
        self.record.seq_at_fault, self.record.version_before = head.seq, head.version
        self.record.detail.update(detail)
        self.record_fault_event()

    def record_fault_event(self) -> None:
        self.ledger.append(self.run_id, "fault_injected", {
            "scenario": self.plan.scenario, "point": self.plan.point, "step": self.plan.step,
            "fired_at": self.record.fired_at.isoformat() if self.record.fired_at else None,
            "version_before": self.record.version_before,
            "detail": {k: v for k, v in self.record.detail.items() if _jsonable(v)},
        })

    def background(self, thread: threading.Thread) -> None:
        self._threads.append(thread)
        thread.start()

    def join_background(self) -> None:
        for thread in self._threads:
            thread.join(timeout=300)

    def on_step(self, job: TrainingJob, step: int) -> None:
        if step == self.plan.step and not self.record.fired:
            logger.warning("drill %s: injecting %s after step %d", self.plan.scenario,
                           self.plan.point, step + 1)
            self.scenario.inject(self, job)


def _jsonable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | list | dict | type(None))


def plan_drills(names: list[str], seed: int | None = None, repeat: int = 1) -> list[FaultPlan]:
    """The drills to run: ``names`` (or ``["all"]``) x ``repeat``.

    Without a seed and with ``repeat == 1``, each scenario at its first step and point. With a
    seed or repeats (chaos mode), steps, points, kill delays and outage lengths are drawn from
    ``random.Random(seed)``: the same seed gives the same plans.

    Raises:
        DrillError: an unknown scenario name, or ``repeat < 1``.
    """
    if names == ["all"] or "all" in names:
        names = list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise DrillError(f"unknown scenario {unknown[0]!r}; choose from "
                         f"{', '.join(SCENARIOS)} or all")
    if repeat < 1:
        raise DrillError(f"--repeat must be at least 1, got {repeat}")
    if seed is None and repeat == 1:
        return [FaultPlan(n, SCENARIOS[n].steps[min(1, len(SCENARIOS[n].steps) - 1)],
                          SCENARIOS[n].points[0]) for n in names]
    rng = random.Random(seed if seed is not None else 0)
    return [
        FaultPlan(n, rng.choice(SCENARIOS[n].steps), rng.choice(SCENARIOS[n].points),
                  delay_s=round(rng.uniform(0.0, 0.05), 3),
                  hold_s=round(rng.uniform(3.0, 8.0), 1))
        for _ in range(repeat) for n in names
    ]


def run_drills(plans: list[FaultPlan], options: DrillOptions = DrillOptions(),
               on_result: Callable[[DrillResult], None] | None = None) -> list[DrillResult]:
    """Run every plan in turn (see :func:`run_drill`); ``on_result`` sees each as it ends."""
    results = []
    for plan in plans:
        result = run_drill(plan, options)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def run_drill(plan: FaultPlan, options: DrillOptions = DrillOptions()) -> DrillResult:
    """Run one drill: a short real run with ``plan``'s fault, then the checker.

    Precondition: Ray is initialised or can be (``launch.init_ray``); the database is
    reachable. Leaves the run's events (``drill_started``, ``fault_injected``,
    ``drill_verdict``) in the ledger and its files under ``options.runs_dir``.

    Raises:
        DrillError: unknown scenario, or the fault cannot be injected here (no local
            PostgreSQL for an outage).
        LedgerError: the ledger cannot be opened.
    """
    scenario = SCENARIOS.get(plan.scenario)
    if scenario is None:
        raise DrillError(f"unknown scenario {plan.scenario!r}")
    drill = _Drill(plan, scenario, options)
    drill.run_dir.mkdir(parents=True, exist_ok=True)
    config = drill.config()
    started = time.monotonic()
    drill.ledger = Ledger.open(drill.ledger_url)
    job: TrainingJob | None = None
    try:
        launch.init_ray(config, options.ray_address)
        drill.ledger.start_run(drill.run_id, config=config.model_dump(mode="json"))
        drill.ledger.append(drill.run_id, "drill_started", {
            "scenario": plan.scenario, "point": plan.point, "step": plan.step,
            "delay_s": plan.delay_s, "hold_s": plan.hold_s, "seed": options.seed,
        })
        job, problems = _run_jobs(drill, config)
        drill.join_background()
        drill.report = check_run(drill.ledger, drill.run_id)
        problems += drill.report.problems
        if not drill.record.fired:
            problems.insert(0, "the fault never fired")
        else:
            problems += drill.record.problems + _expectations(drill, job)
        return _verdict(drill, problems, time.monotonic() - started)
    finally:
        if job is not None:
            job.shutdown()
        drill.join_background()
        drill.ledger.close()


def _expectations(drill: _Drill, job: TrainingJob | None) -> list[str]:
    """The scenario's own checks; one that cannot even be evaluated is a problem too."""
    try:
        return drill.scenario.expect(drill, job)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor to question is dead
        return [f"could not check {drill.plan.scenario}: {_error_name(exc)}: {str(exc)[:200]}"]


def _run_jobs(drill: _Drill, config: RunConfig) -> tuple[TrainingJob | None, list[str]]:
    """Run the job (twice for a resume drill) under the deadline; returns the last job (its
    actors still up, for the scenario's checks) and any problem with the run itself."""
    options = JobOptions(runs_dir=drill.options.runs_dir, progress=False, plot=False,
                         on_step=drill.on_step)
    job = drill.options.job_class(config, drill.ledger, drill.run_dir, options)
    error = _run_with_deadline(job, drill.options.deadline_s)
    if isinstance(error, _StopRun):
        job.shutdown()
        resumed = JobOptions(resume=True, runs_dir=drill.options.runs_dir, progress=False,
                             plot=False)
        job = drill.options.job_class(config, drill.ledger, drill.run_dir, resumed)
        error = _run_with_deadline(job, drill.options.deadline_s)
    if error is None:
        return job, []
    return job, [f"the run did not complete: {type(error).__name__}: {str(error)[:300]}"]


def _run_with_deadline(job: TrainingJob, deadline_s: float) -> BaseException | None:
    """Run ``job.run()`` on a thread; past ``deadline_s`` (no recovery), kill the job's actors
    so the thread ends. Returns the job's error, or None when it finished."""
    outcome: dict[str, BaseException | None] = {"error": None}

    def target() -> None:
        try:
            job.run()
        except BaseException as exc:  # noqa: BLE001 - reported in the verdict
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"drill-job-{job.run_id}", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if not thread.is_alive():
        return outcome["error"]
    negative = _negative_staleness_now(job)
    for actor in [job.manager, *job.engines.values()]:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    if job.cells is not None:
        job.cells.stop()
    thread.join(120)
    return TimeoutError(f"no recovery: the run did not finish within {deadline_s:g}s "
                        f"(negative staleness counted so far: {negative})")


def _negative_staleness_now(job: TrainingJob) -> int | None:
    try:
        metrics = ray.get(job.manager.metrics.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - the manager may be the thing that is stuck
        return None
    return int(metrics.get("rollout/fully_async/negative_staleness_total", 0))


def _verdict(drill: _Drill, problems: list[str], wall_s: float) -> DrillResult:
    recover_s = None
    if drill.record.fired_at is not None:
        commit = first_commit_after(drill.ledger, drill.run_id, drill.record.seq_at_fault)
        if commit is not None:
            recover_s = round(seconds_between(drill.record.fired_at, commit.recorded_at), 3)
        else:
            problems.append("no version was committed after the fault")
    report = drill.report
    result = DrillResult(
        plan=drill.plan, run_id=drill.run_id, ledger_url=drill.ledger_url,
        passed=not problems, recover_s=recover_s, version_before=drill.record.version_before,
        version_after=report.head_version, negative_staleness=report.negative_staleness,
        groups_lost=report.prompts_unaccounted, problems=problems, wall_s=round(wall_s, 1),
        detail=dict(drill.record.detail),
    )
    drill.ledger.append(drill.run_id, "drill_verdict", {
        "scenario": drill.plan.scenario, "point": drill.plan.point, "step": drill.plan.step,
        "verdict": "pass" if result.passed else "fail", "recover_s": recover_s,
        "version_before": result.version_before, "version_after": result.version_after,
        "negative_staleness": result.negative_staleness, "groups_lost": result.groups_lost,
        "problems": problems[:20],
    })
    return result
