"""What a job is asked to do and what it reports: :class:`JobOptions`, :class:`JobResult`,
the run id format, and the job's hooks with the ``on_step`` shorthand (:class:`StepHooks`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ledger.run_layout import DEFAULT_RUNS_DIR
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.hooks import JobHooks

__all__ = ["EngineFactory", "JobOptions", "JobResult", "StepHook", "StepHooks", "new_run_id"]

StepHook = Callable[[Any, int], None]  # (the TrainingJob, step)
EngineFactory = Callable[[RunConfig, str], Any]


@dataclass(frozen=True)
class JobOptions:
    """How to run a job (what to train is the RunConfig). ``hooks``: where drills and tests act
    on the job at named points; ``on_step(job, step)``: a hook after each step's metrics line;
    ``engine_factory`` builds one engine actor (benchmarks model an accelerator with one)."""

    resume: bool = False
    ray_address: str | None = None
    runs_dir: Path = DEFAULT_RUNS_DIR
    progress: bool = True
    plot: bool = True
    on_step: StepHook | None = None
    hooks: JobHooks = field(default_factory=JobHooks)
    engine_factory: EngineFactory = launch.create_engine


@dataclass
class JobResult:
    """What a finished job reports."""

    run_id: str
    run_dir: Path
    ledger_url: str
    metrics_path: Path
    plot_path: Path | None
    steps: int
    head_version: int
    wall_s: float
    reward_first: float
    reward_last: float
    promotions: int
    negative_staleness_total: int
    audit_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.audit_problems and self.negative_staleness_total == 0


def new_run_id() -> str:
    """``run-YYYYmmdd-HHMMSS-xxxx``: sortable by start time, unique enough per machine."""
    return f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


class StepHooks(JobHooks):
    """The job's hooks plus the ``on_step`` shorthand."""

    def __init__(self, hooks: JobHooks, on_step: StepHook | None) -> None:
        self._hooks = hooks
        self._on_step = on_step

    def before_train_step(self, job: Any, step: int) -> None:
        self._hooks.before_train_step(job, step)

    def after_train_step(self, job: Any, step: int) -> None:
        self._hooks.after_train_step(job, step)

    def before_publish(self, job: Any) -> None:
        self._hooks.before_publish(job)

    def on_step_end(self, job: Any, step: int) -> None:
        self._hooks.on_step_end(job, step)
        if self._on_step is not None:
            self._on_step(job, step)
