"""Recovery drills: real faults injected into a real short run, then a check of DESIGN section 4.

Modelled on Jepsen (a nemesis acts on real processes while a workload runs, then a checker
judges the recorded history) and on etcd's robustness tests (failpoints before and after the
commit). Each drill:

1. declares its schedule up front as a :class:`FaultPlan` (scenario, step, point), recorded in
   a ``drill_started`` event before the run trains;
2. runs a short fully-async job (Ray cells, engines, rollout manager, the ledger) with the
   drill's :class:`DrillHooks`: at the planned step's ``on_step_end`` the scenario injects its
   fault from outside (SIGKILL/SIGSTOP of the real worker processes, the database stopped or
   its file locked, the job stopped and resumed), or arms a fault primitive that the control
   plane then calls at its named hook points (inside the next training step, or right before
   the next publish). No production object is modified;
3. records that the fault really fired (``fault_injected``, with the head at that moment): a
   drill whose fault did not fire fails, so no drill passes by not injecting;
4. lets the run recover and go on for a few steps, then judges the history with
   :func:`orchestrator.drills.checker.check_run` plus the scenario's own expectations, and records
   ``drill_verdict``.

A run that does not finish within ``deadline_s`` (a recovery that never comes) fails too: its
actors are killed so the drill returns.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger import EventKind, Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.driver import JobOptions, TrainingJob
from orchestrator.control.hooks import JobHooks
from orchestrator.drills.checker import (CheckReport, check_run, first_recovery_commit,
                                         seconds_between)
from orchestrator.drills.context import DrillError, FaultPlan, FaultRecord, StopRun, error_name
from orchestrator.drills.crash import run_whole_job_crash
from orchestrator.drills.planning import plan_drills
from orchestrator.drills.node_loss import MIN_WORKER_NODES, NODE_SCENARIOS
from orchestrator.drills.scenarios import SCENARIOS, Scenario
from orchestrator.drills.watchdog import run_with_deadlines

if TYPE_CHECKING:
    from orchestrator.control.placement.local import LocalCluster

__all__ = [
    "SCENARIOS",
    "DrillError",
    "DrillHooks",
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
    ``deadline_s`` bounds a whole run; ``recover_deadline_s`` (if set) also bounds the time
    from the fault to the run's end, so a recovery that never comes is caught soon after the
    fault however long the run took to start.
    ``local_nodes`` > 0 runs the drills on a local multi-node cluster built for them (a
    driver-only head plus that many worker nodes: ``kill-node`` needs it, and a PostgreSQL
    ``db``, since a SQLite ledger is refused on more than one node).
    """

    runs_dir: Path = Path("runs/drills")
    db: str | None = None
    seed: int = 1234
    recover_steps: int = RECOVER_STEPS
    deadline_s: float = 240.0
    recover_deadline_s: float | None = None
    ray_address: str | None = None
    job_class: type[TrainingJob] = TrainingJob
    local_nodes: int = 0


class DrillHooks(JobHooks):
    """The job hooks of one drill: inject the scenario's fault at the planned step's end, and
    forward every hook point to the fault primitives the scenario armed."""

    def __init__(self, drill: _Drill) -> None:
        self.drill = drill
        self.armed: list[JobHooks] = []

    def before_train_step(self, job: TrainingJob, step: int) -> None:
        for hooks in list(self.armed):
            hooks.before_train_step(job, step)

    def after_train_step(self, job: TrainingJob, step: int) -> None:
        for hooks in list(self.armed):
            hooks.after_train_step(job, step)

    def before_publish(self, job: TrainingJob) -> None:
        for hooks in list(self.armed):
            hooks.before_publish(job)

    def on_step_end(self, job: TrainingJob, step: int) -> None:
        drill = self.drill
        if step == drill.plan.step and not drill.record.fired:
            logger.warning("drill %s: injecting %s after step %d", drill.plan.scenario,
                           drill.plan.point, step + 1)
            drill.scenario.inject(drill, job)
        for hooks in list(self.armed):
            hooks.on_step_end(job, step)


class _Drill:
    """One drill's state: its plan, run, ledger handle, and what its fault recorded. It is
    the :class:`~orchestrator.drills.context.DrillContext` its scenario acts through."""

    def __init__(self, plan: FaultPlan, scenario: Scenario, options: DrillOptions,
                 cluster: LocalCluster | None = None) -> None:
        self.plan = plan
        self.cluster = cluster
        self.scenario = scenario
        self.options = options
        self.rng = random.Random(f"{options.seed}:{plan}")
        self.run_id = (f"drill-{plan.scenario}-{datetime.now(UTC):%Y%m%d-%H%M%S}-"
                       f"{secrets.token_hex(2)}")
        self.layout = RunLayout.of(options.runs_dir, self.run_id)
        self.ledger_url = options.db or self.layout.ledger_url
        self.record = FaultRecord()
        self.hooks = DrillHooks(self)
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger.open(self.ledger_url)
        self._threads: list[threading.Thread] = []

    def config(self) -> RunConfig:
        return RunConfig(
            run_id=self.run_id, db=self.ledger_url, rollout_batch_size=4,
            n_samples_per_prompt=4, async_max_concurrent_samples=4,
            num_rollout=self.plan.step + 1 + self.options.recover_steps,
            num_cells=self.scenario.num_cells, num_engines=2, save_interval=2,
            heartbeat_timeout_s=DRILL_HEARTBEAT_S, seed=self.options.seed,
        )

    # ---- DrillContext

    def fired(self, job: TrainingJob, **detail: Any) -> None:
        self.record.mark_fired(job.ledger.head(job.run_id), **detail)
        self.record_fault_event()

    def record_fault_event(self) -> None:
        self.ledger.append(self.run_id, EventKind.FAULT_INJECTED,
                           self.record.fault_injected(self.plan))

    def background(self, thread: threading.Thread) -> None:
        self._threads.append(thread)
        thread.start()

    def arm(self, hooks: JobHooks) -> None:
        self.hooks.armed.append(hooks)

    # ---- the runner's own

    def join_background(self) -> None:
        for thread in self._threads:
            thread.join(timeout=300)


def run_drills(plans: list[FaultPlan], options: DrillOptions = DrillOptions(),
               on_result: Callable[[DrillResult], None] | None = None) -> list[DrillResult]:
    """Run every plan in turn (see :func:`run_drill`); ``on_result`` sees each as it ends.
    With ``options.local_nodes``, on a local multi-node cluster built first (this process
    must not be connected to Ray yet) and shut down at the end."""
    cluster = None
    if options.local_nodes:
        from orchestrator.control.placement.local import LocalCluster

        cluster = LocalCluster(options.local_nodes)
        cluster.connect()
    results = []
    try:
        for plan in plans:
            result = run_drill(plan, options, cluster=cluster)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        if cluster is not None:
            cluster.shutdown()
    return results


def run_drill(plan: FaultPlan, options: DrillOptions = DrillOptions(),
              cluster: LocalCluster | None = None) -> DrillResult:
    """Run one drill: a short real run with ``plan``'s fault, then the checker.

    Precondition: Ray is initialised or can be (``launch.init_ray``); the database is
    reachable. Leaves the run's events (``drill_started``, ``fault_injected``,
    ``drill_verdict``) in the ledger and its files under ``options.runs_dir``.

    Raises:
        DrillError: unknown scenario, or the fault cannot be injected here (no local
            PostgreSQL for an outage, no local multi-node ``cluster`` to remove a node from).
        LedgerError: the ledger cannot be opened.
        StartupError: a ledger URL the cluster's nodes cannot share.
    """
    scenario = SCENARIOS.get(plan.scenario) or NODE_SCENARIOS.get(plan.scenario)
    if scenario is None:
        raise DrillError(f"unknown scenario {plan.scenario!r}")
    if plan.scenario in NODE_SCENARIOS and (
            cluster is None or len(cluster.worker_node_ids()) < MIN_WORKER_NODES):
        raise DrillError(f"{plan.scenario} removes a node: run it with --local-nodes "
                         f"{MIN_WORKER_NODES} (or more) and a PostgreSQL --db")
    drill = _Drill(plan, scenario, options, cluster)
    config = drill.config()
    started = time.monotonic()
    job: TrainingJob | None = None
    try:
        launch.init_ray(config, options.ray_address)
        config = launch.resolve_devices(config)  # auto: CUDA where Ray reports GPUs
        launch.check_cluster_ledger(config, drill.ledger_url, options.ray_address)
        drill.ledger.start_run(drill.run_id, config=config.model_dump(mode="json"))
        drill.ledger.append(drill.run_id, EventKind.DRILL_STARTED, {
            "scenario": plan.scenario, "point": plan.point, "step": plan.step,
            "delay_s": plan.delay_s, "hold_s": plan.hold_s, "seed": options.seed,
        })
        if scenario.crash is not None:
            problems = run_whole_job_crash(drill, config, options.runs_dir, scenario.crash,
                                           options.deadline_s)
        else:
            job, problems = _run_jobs(drill, config)
        drill.join_background()
        report = check_run(drill.ledger, drill.run_id)
        problems += report.problems
        if not drill.record.fired:
            problems.insert(0, "the fault never fired")
        else:
            problems += drill.record.problems + _expectations(drill, job, report)
        return _verdict(drill, report, problems, time.monotonic() - started)
    finally:
        if job is not None:
            job.shutdown()
        drill.join_background()
        drill.ledger.close()


def _expectations(drill: _Drill, job: TrainingJob | None, report: CheckReport) -> list[str]:
    """The scenario's own checks; one that cannot even be evaluated is a problem too."""
    try:
        return drill.scenario.expect(drill, job, report.state)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor to question is dead
        return [f"could not check {drill.plan.scenario}: {error_name(exc)}: {str(exc)[:200]}"]


def _run_jobs(drill: _Drill, config: RunConfig) -> tuple[TrainingJob | None, list[str]]:
    """Run the job (twice for a resume drill) under the deadline; returns the last job (its
    actors still up, for the scenario's checks) and any problem with the run itself."""
    options = JobOptions(runs_dir=drill.options.runs_dir, progress=False, plot=False,
                         hooks=drill.hooks)
    job = drill.options.job_class(config, drill.ledger, drill.layout, options)
    error = _watched(job, drill)
    if isinstance(error, StopRun):
        job.shutdown()
        resumed = JobOptions(resume=True, runs_dir=drill.options.runs_dir, progress=False,
                             plot=False)
        job = drill.options.job_class(config, drill.ledger, drill.layout, resumed)
        error = _watched(job, drill)
    if error is None:
        return job, []
    return job, [f"the run did not complete: {type(error).__name__}: {str(error)[:300]}"]


def _watched(job: TrainingJob, drill: _Drill) -> BaseException | None:
    return run_with_deadlines(job, drill.record, deadline_s=drill.options.deadline_s,
                              recover_deadline_s=drill.options.recover_deadline_s)


def _verdict(drill: _Drill, report: CheckReport, problems: list[str],
             wall_s: float) -> DrillResult:
    recover_s = None
    if drill.record.fired_at is not None:
        commit = first_recovery_commit(report.state, drill.record.seq_at_fault)
        if commit is not None:
            recover_s = round(seconds_between(drill.record.fired_at, commit.recorded_at), 3)
        else:
            problems.append("no version was committed after the fault")
    result = DrillResult(
        plan=drill.plan, run_id=drill.run_id, ledger_url=drill.ledger_url,
        passed=not problems, recover_s=recover_s, version_before=drill.record.version_before,
        version_after=report.head_version, negative_staleness=report.negative_staleness,
        groups_lost=report.prompts_unaccounted, problems=problems, wall_s=round(wall_s, 1),
        detail=dict(drill.record.detail),
    )
    drill.ledger.append(drill.run_id, EventKind.DRILL_VERDICT, {
        "scenario": drill.plan.scenario, "point": drill.plan.point, "step": drill.plan.step,
        "verdict": "pass" if result.passed else "fail", "recover_s": recover_s,
        "version_before": result.version_before, "version_after": result.version_after,
        "negative_staleness": result.negative_staleness, "groups_lost": result.groups_lost,
        "problems": problems[:20],
    })
    return result
