"""The nemesis of the recovery drills: each scenario's fault and what recovery must show.

A :class:`Scenario` names a fault, the points and steps where it may land, the function that
injects it into a live :class:`~orchestrator.control.driver.TrainingJob` from outside (real signals to
real worker processes, the database stopped or locked, the job stopped), and the scenario's own
expectations on top of the generic checker (:mod:`orchestrator.drills.checker`). Where a fault must
land between the publisher's update steps, the nemesis drives the publisher's public
``begin_update`` / ``transfer`` / ``commit`` itself, then kills it: production classes carry no
fault hooks. The runner is :mod:`orchestrator.drills.runner`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError

from ledger import FencedError
from orchestrator.drills.checker import first_commit_after
from orchestrator.control.driver import TrainingJob

if TYPE_CHECKING:
    from orchestrator.drills.runner import _Drill

__all__ = [
    "SCENARIOS",
    "DrillError",
    "FaultPlan",
    "FaultRecord",
    "Scenario",
    "StopRun",
    "error_name",
    "kill_and_wait",
    "utcnow_naive",
]

PG_CLUSTER_NAME = "main"


class DrillError(ValueError):
    """A drill that cannot be run as asked (unknown scenario, no local PostgreSQL): one line."""


@dataclass(frozen=True)
class FaultPlan:
    """The declared schedule of one drill.

    ``step`` is the 0-based step after which the nemesis acts (``mid-train`` lands inside the
    next step's training). ``delay_s`` is how long after the publisher is seen computing in
    that step the kill lands; ``hold_s`` is how long a database outage lasts.
    """

    scenario: str
    step: int
    point: str
    delay_s: float = 0.0
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


MID_TRAIN_ATTEMPTS = 5  # training steps the nemesis may wait for one it can catch
_COMPUTING_NS = 2_000_000  # CPU time of the worker's main thread that means "in a step"


def _kill_publisher_mid_train(drill: _Drill, job: TrainingJob) -> None:
    """Arm a wrapper on this job's CellGroup: during the next training step, once the
    publisher's main thread is seen computing (it gains ``_COMPUTING_NS`` of CPU time; an idle
    Ray worker's main thread gains none), wait ``delay_s`` and SIGKILL it. A step too short to
    catch is let through and the next one is tried (up to ``MID_TRAIN_ATTEMPTS``), so the
    kill always lands inside a step. The group's own code is untouched."""
    cell_id, epoch, actor = _publisher(job)
    pid = _pid(actor)
    cells = job.cells
    original = cells.train_step
    in_step = threading.Event()
    attempts = {"count": 0}

    def kill_when_computing() -> None:
        baseline = _cpu_ns(pid)
        while in_step.is_set() and _cpu_ns(pid) - baseline < _COMPUTING_NS:
            time.sleep(0.0005)
        if not in_step.is_set():
            return  # the step ended first: try the next one
        time.sleep(drill.plan.delay_s)
        during = in_step.is_set()
        detect_s = kill_and_wait(actor, pid)
        drill.fired(job, cell=cell_id, epoch=epoch, pid=pid, during_train_step=during,
                    steps_watched=attempts["count"], ray_detect_s=round(detect_s, 3))

    def train_step_with_fault(groups):
        attempts["count"] += 1
        killer = threading.Thread(target=kill_when_computing, name="drill-nemesis",
                                  daemon=True)
        in_step.set()
        killer.start()
        try:
            return original(groups)
        finally:
            in_step.clear()
            killer.join()
            if drill.record.fired or attempts["count"] >= MID_TRAIN_ATTEMPTS:
                cells.train_step = original

    cells.train_step = train_step_with_fault


def _cpu_ns(pid: int) -> int:
    """CPU time of ``pid``'s main thread in ns (Linux ``/proc/PID/schedstat``), which is
    the thread a Ray worker runs its actor's tasks on; 0 if the process is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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
            refused[name] = error_name(exc)
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
    drill.record.fired_at = utcnow_naive()
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


class StopRun(Exception):
    """Raised from the drill's hook to stop the first half of resume-from-old-checkpoint."""


def _stop_run(drill: _Drill, job: TrainingJob) -> None:
    drill.fired(job, stopped_after_step=job.step + 1)
    raise StopRun(f"drill stops {job.run_id} after step {job.step + 1}")


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


def error_name(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if cause is not None else type(exc).__name__


def utcnow_naive() -> datetime:
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
