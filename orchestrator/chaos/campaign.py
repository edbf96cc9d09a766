"""The chaos campaign: one long run under a seeded nemesis, judged by the history checker.

:func:`run_campaign` draws the schedule (:func:`~orchestrator.chaos.nemesis.draw_schedule`),
starts the run in the ledger and records the whole schedule up front (``drill_started``), then
runs the job in a process of its own (:mod:`orchestrator.chaos.job_process`) whose hooks fire
each fault at its step with the drills' primitives and record ``fault_injected`` as it fires.
A fault that kills the driver (or everything) kills that process; the runner resumes the run
in a new one, whose hooks skip what already fired, until the run ends, fails, or passes its
deadline. Then the whole ledger is judged: :func:`~orchestrator.chaos.history.check_history`
with the audit's problems (``ledger verify``), the deadline, and, with a reward tolerance, the
final reward of a fault-free run of the same seed.

The verdict is green only with zero breaches. Kinds the campaign cannot inject here are left
out of the default set and said so in :attr:`CampaignResult.notes` (``kill-node`` needs a local
multi-node cluster and PostgreSQL; an outage of PostgreSQL needs a local server to stop).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import make_url

from ledger import EventKind, Ledger
from ledger.run_layout import REWARD_KEY, STEP_KEY, RunLayout
from orchestrator.chaos.history import (
    REWARD_WINDOW,
    Breach,
    CampaignFacts,
    HistoryVerdict,
    check_history,
)
from orchestrator.chaos.job_process import JobSpec, write_spec
from orchestrator.chaos.nemesis import FaultKind, PlannedFault, draw_schedule
from orchestrator.chaos.recovery import FiredFault, fired_faults
from orchestrator.config import RunConfig

__all__ = ["CampaignOptions", "CampaignResult", "campaign_kinds", "run_campaign"]

CAMPAIGN_HEARTBEAT_S = 3.0  # as the drills: a frozen publisher is failed over quickly
HANG_AFTER_S = 180.0  # the longest silence in the ledger that is not a hang
# The learning check compares one campaign with one fault-free run, so the job must not collapse
# on its own. At the default 3e-3 about one fault-free 200-step run in ten of this small job
# (4 prompts x 4 samples) fell into a zero-reward absorbing state after a one-step KL spike of
# 1-4; at 1e-3 none of 20 did (largest KL 0.34) and the final reward stayed where it was
# (docs/benchmarks.md, the chaos campaigns).
CAMPAIGN_LR = 1e-3
MAX_JOB_PROCESSES = 100  # resumes of one campaign, a bound and never a loop


@dataclass(frozen=True)
class CampaignOptions:
    """One campaign. ``deadline_s`` None: 600 s plus 15 s a step. ``reward_tolerance`` None:
    no fault-free baseline is run and the learning check is skipped."""

    steps: int = 200
    seed: int = 1
    mean_interval: float = 10.0
    overlap: bool = False
    exclude: tuple[FaultKind, ...] = ()
    db: str | None = None
    local_nodes: int = 0
    deadline_s: float | None = None
    reward_tolerance: float | None = None
    runs_dir: Path = Path("runs/chaos")

    @property
    def deadline(self) -> float:
        return self.deadline_s if self.deadline_s is not None else 600.0 + 15.0 * self.steps


@dataclass
class CampaignResult:
    """What a campaign did and the checker's verdict on it."""

    options: CampaignOptions
    run_id: str
    ledger_url: str
    schedule: list[PlannedFault]
    fired: list[FiredFault]
    verdict: HistoryVerdict
    job_processes: int
    wall_s: float
    final_reward: float | None = None
    baseline_reward: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict.ok


def campaign_kinds(options: CampaignOptions) -> tuple[list[FaultKind], list[str]]:
    """The kinds this campaign draws from (every kind less ``exclude``, less those it cannot
    inject here), and one note per kind left out for that reason."""
    postgres = options.db is not None and make_url(options.db).get_backend_name() == "postgresql"
    notes, kinds = [], []
    for kind in FaultKind:
        if kind in options.exclude:
            continue
        if kind is FaultKind.KILL_NODE and (options.local_nodes < 2 or not postgres):
            notes.append("kill-node left out: it needs --local-nodes 2 (or more) and a "
                         "PostgreSQL --db")
        elif kind is FaultKind.DATABASE_OUTAGE and postgres and not os.path.isdir(
                "/etc/postgresql"):
            notes.append("database-outage left out: no local PostgreSQL cluster to stop")
        else:
            kinds.append(kind)
    return kinds, notes


def campaign_config(options: CampaignOptions, run_id: str, ledger_url: str) -> RunConfig:
    """The run a campaign trains: the drills' small job, ``steps`` steps long, at
    :data:`CAMPAIGN_LR`, with a restart budget sized to the schedule (a campaign replaces many
    actors within ten minutes)."""
    return RunConfig(
        run_id=run_id, db=ledger_url, lr=CAMPAIGN_LR, rollout_batch_size=4,
        n_samples_per_prompt=4, async_max_concurrent_samples=4, num_rollout=options.steps,
        num_cells=2, num_engines=2, save_interval=2, heartbeat_timeout_s=CAMPAIGN_HEARTBEAT_S,
        seed=options.seed, max_restarts=max(10, options.steps),
    )


def run_campaign(options: CampaignOptions) -> CampaignResult:
    """Run one campaign to its verdict (see the module doc).

    Precondition: no Ray cluster is needed in this process (the job runs in its own); the
    database is reachable. Leaves the run's events and files under ``options.runs_dir``.

    Raises:
        ValueError: a schedule that cannot be drawn (every kind excluded, too few steps).
        LedgerError: the ledger cannot be opened or read.
    """
    kinds, notes = campaign_kinds(options)
    schedule = draw_schedule(options.seed, options.steps, mean_interval=options.mean_interval,
                             kinds=kinds, overlap=options.overlap)
    run_id = (f"chaos-s{options.seed}-{datetime.now(UTC):%Y%m%d-%H%M%S}-"
              f"{secrets.token_hex(2)}")
    layout = RunLayout.of(options.runs_dir, run_id)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    ledger_url = options.db or RunLayout.of(options.runs_dir.resolve(), run_id).ledger_url
    config = campaign_config(options, run_id, ledger_url)
    baseline = _baseline_reward(options, config) if options.reward_tolerance is not None else None
    ledger = Ledger.open(ledger_url)
    started = time.monotonic()
    try:
        ledger.start_run(run_id, config=config.model_dump(mode="json"))
        ledger.append(run_id, EventKind.DRILL_STARTED, {
            "scenario": "chaos", "seed": options.seed, "steps": options.steps,
            "mean_interval": options.mean_interval, "overlap": options.overlap,
            "kinds": [kind.value for kind in kinds],
            "schedule": [fault.to_payload() for fault in schedule],
        })
        processes, extra = _run_job_processes(options, config, schedule, layout, started,
                                              ledger)
        wall_s = time.monotonic() - started
        rewards = _step_rewards(layout)
        final = _final_reward(rewards)
        facts = CampaignFacts(
            target_steps=options.steps, deadline_s=options.deadline, elapsed_s=wall_s,
            hang_after_s=HANG_AFTER_S, final_reward=final, baseline_reward=baseline,
            reward_tolerance=options.reward_tolerance or 0.0, rewards=rewards,
            audit_problems=[(p.check, p.seq, p.message)
                            for p in ledger.verify(run_id).problems],
        )
        events = list(ledger.events(run_id))
        verdict = check_history(events, facts)
        verdict.breaches += extra
        _record_verdict(ledger, run_id, verdict)
        return CampaignResult(options, run_id, ledger_url, schedule, fired_faults(events),
                              verdict, processes, round(wall_s, 1), final, baseline, notes)
    finally:
        ledger.close()


def _run_job_processes(options: CampaignOptions, config: RunConfig,
                       schedule: list[PlannedFault], layout: RunLayout, started: float,
                       ledger: Ledger) -> tuple[int, list[Breach]]:
    """Run the job, resuming it after each fault that killed it, until it ends; returns how
    many processes ran and the breaches the processes themselves showed (a hang past the
    deadline, an exit that is neither a finish, a recorded failure nor a fault's kill, a
    SIGKILL that no planned job kill recorded)."""
    breaches: list[Breach] = []
    crashes_seen = 0
    resume = False
    for number in range(1, MAX_JOB_PROCESSES + 1):
        spec = write_spec(layout.run_dir / f"chaos-job-{number}.json", JobSpec(
            config=config.model_dump(mode="json"), runs_dir=str(options.runs_dir),
            resume=resume, schedule=[fault.to_payload() for fault in schedule],
            seed=options.seed, local_nodes=options.local_nodes))
        log = layout.run_dir / f"chaos-job-{number}.log"
        left = options.deadline - (time.monotonic() - started)
        code = _run_process([sys.executable, "-m", "orchestrator.chaos.job_process", str(spec)],
                            log, max(left, 1.0))
        if code is None:
            return number, [Breach("liveness", f"job process {number} still running at the "
                                   f"deadline of {options.deadline:g} s; killed ({log})")]
        if code == -signal.SIGKILL:
            crashes = _job_kills_recorded(ledger, config.run_id or "")
            if crashes <= crashes_seen:
                breaches.append(Breach("liveness", f"job process {number} was SIGKILLed "
                                       f"without a planned kill recorded ({log})"))
            crashes_seen = crashes
            resume = True  # a fault killed the driver: the run goes on in a new process
            continue
        if code in (0, 1):  # finished, or failed with run_failed (the checker says why)
            return number, breaches
        return number, [*breaches, Breach("liveness", f"job process {number} exited {code}: "
                                          f"{_tail(log)}")]
    return MAX_JOB_PROCESSES, [*breaches, Breach("liveness", f"more than {MAX_JOB_PROCESSES} "
                                                 "job processes: the run kept dying")]


def _job_kills_recorded(ledger: Ledger, run_id: str) -> int:
    """How many planned faults that kill the job (driver, everything) the ledger records."""
    kills = {FaultKind.KILL_DRIVER.value, FaultKind.KILL_EVERYTHING.value}
    return sum(1 for event in ledger.events(run_id) if event.kind == EventKind.FAULT_INJECTED
               and (event.payload.get("fault") or {}).get("kind") in kills)


def _run_process(command: list[str], log: Path, timeout_s: float) -> int | None:
    """Run ``command`` in a session of its own (output to ``log``); returns its exit code, or
    None if it ran past ``timeout_s``. Whatever it left running in its session (its Ray
    processes, after a SIGKILL) is killed afterwards."""
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    with log.open("w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        code: int | None = None
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also when this process is interrupted: no job outlives its campaign
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    return code


def _tail(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return " ".join(text[-400:].split())


def _step_rewards(layout: RunLayout) -> list[float]:
    """The run's mean reward per step in step order (its ``metrics.jsonl``; a step recorded
    twice, by a job and by the job that resumed it, counts once: the later record)."""
    if not layout.metrics_path.exists():
        return []
    by_step: dict[int, float] = {}
    for line in layout.metrics_path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        reward, step = record.get(REWARD_KEY), record.get(STEP_KEY)
        if isinstance(reward, int | float) and isinstance(step, int):
            by_step[step] = float(reward)
    return [by_step[step] for step in sorted(by_step)]


def _final_reward(rewards: list[float]) -> float | None:
    """Mean reward of the run's last :data:`REWARD_WINDOW` steps."""
    return statistics.fmean(rewards[-REWARD_WINDOW:]) if rewards else None


def _baseline_reward(options: CampaignOptions, config: RunConfig) -> float | None:
    """The final reward of a fault-free run of the same seed and length (miles' criterion)."""
    run_id = f"{config.run_id}-baseline"
    layout = RunLayout.of(options.runs_dir, run_id)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    ledger_url = options.db or RunLayout.of(options.runs_dir.resolve(), run_id).ledger_url
    baseline = config.model_copy(update={"run_id": run_id, "db": ledger_url})
    spec = write_spec(layout.run_dir / "chaos-job-1.json", JobSpec(
        config=baseline.model_dump(mode="json"), runs_dir=str(options.runs_dir), resume=False,
        schedule=[], seed=options.seed, local_nodes=options.local_nodes))
    _run_process([sys.executable, "-m", "orchestrator.chaos.job_process", str(spec)],
                 layout.run_dir / "chaos-job-1.log", options.deadline)
    return _final_reward(_step_rewards(layout))


def _record_verdict(ledger: Ledger, run_id: str, verdict: HistoryVerdict) -> None:
    ledger.append(run_id, EventKind.DRILL_VERDICT, {
        "scenario": "chaos", "verdict": "pass" if verdict.ok else "fail",
        "faults": len(verdict.faults), "breaches": [str(b) for b in verdict.breaches[:20]],
    })
