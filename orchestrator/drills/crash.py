"""Whole-job crashes: ``kill-driver`` and ``kill-everything``.

Every other drill kills a part of the job from the driver's side. These kill the driver
itself, so the job runs in a child process (``python -m orchestrator.drills.crash SPEC``) whose
:class:`CrashHooks` SIGKILL that process at the planned point:

- ``between-commit-and-stamp``: at the planned step's publish, the publisher is armed to
  freeze itself right after its commit (``UpdatePoint.AFTER_COMMIT`` of THE update sequence,
  :mod:`actors.publishing.sequence`) and the job's own publish runs into it: a version is
  committed, the engines are paused and unstamped, and the driver dies.
- ``mid-drain``: once the step has ended, while the driver waits for the next drain (the
  producer has part of the batch), the driver dies.

``kill-driver`` kills the driver process alone (Ray tears down what it started);
``kill-everything`` kills the driver and every worker process of the job (cells, engines,
rollout manager) at the same instant, as a machine crash does. Before dying, the child appends
``fault_injected`` with the ledger head it saw. The runner then resumes the run from a second
process (``orchestrator run --resume``) and judges it like every drill, plus the prompt
accounting from the ledger alone: no prompt trained twice, none lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from actors.publishing.sequence import UpdatePoint
from ledger import EventKind, Ledger
from orchestrator.metric_keys import metric_key
from orchestrator.config import RunConfig
from orchestrator.control.hooks import JobHooks
from orchestrator.control.provenance_recorder import prompt_ledger
from orchestrator.drills.context import DrillContext, DrillPoint, utcnow_naive
from orchestrator.drills.faults import actor_pid, arm_update_stop, publisher_of, wait_stopped

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = ["CRASH_POINTS", "CrashHooks", "expect_prompts_once", "run_whole_job_crash"]

CRASH_POINTS = (DrillPoint.BETWEEN_COMMIT_AND_STAMP, DrillPoint.MID_DRAIN)
_MID_DRAIN_DELAY_S = 0.05
_PID_TIMEOUT_S = 10.0  # a live worker answers in milliseconds; a frozen one never


class CrashHooks(JobHooks):
    """In the child: kill this process (and, for ``everything``, the job's workers) at the
    planned point of ``step``. ``fault``: the planned fault of a chaos campaign, recorded with
    the ``fault_injected`` event."""

    def __init__(self, scenario: str, point: str, step: int, what: str,
                 fault: dict[str, Any] | None = None) -> None:
        self.scenario, self.point, self.step, self.what = scenario, point, step, what
        self.fault = fault
        self._armed = False

    def on_step_end(self, job: TrainingJob, step: int) -> None:
        if step != self.step:
            return
        if self.point == DrillPoint.MID_DRAIN:
            threading.Thread(target=self._die_soon, args=(job,), daemon=True).start()
        else:
            self._armed = True  # the next publish

    def before_publish(self, job: TrainingJob) -> None:
        if not self._armed:
            return
        self._armed = False
        target = publisher_of(job)
        pids = self._pids(job)  # now: a frozen cell answers nothing
        arm_update_stop(target, UpdatePoint.AFTER_COMMIT)
        threading.Thread(target=self._die_when_frozen, args=(job, target.pid, pids),
                         daemon=True).start()

    def _die_when_frozen(self, job: TrainingJob, cell_pid: int, pids: list[int]) -> None:
        if wait_stopped(cell_pid):
            self._die(job, pids, committed=job.ledger.head(job.run_id).version)

    def _die_soon(self, job: TrainingJob) -> None:
        time.sleep(_MID_DRAIN_DELAY_S)
        try:
            queued = ray.get(job.supervisor.manager.metrics.remote(), timeout=30)
            queue_size = queued.get(metric_key("queue_size"))
        except Exception:  # noqa: BLE001 - a manager frozen or lost by an earlier fault
            queue_size = None  # the kill goes ahead: the queue size is only a detail
        self._die(job, self._pids(job), queue_size=queue_size)

    def _pids(self, job: TrainingJob) -> list[int]:
        """This process, and for ``everything`` every worker of the job that answers (one
        frozen or lost by an earlier fault of a chaos campaign cannot say its pid, and is
        left to Ray, which tears down what the dead driver started)."""
        pids = [os.getpid()]
        if self.what == "everything":
            actors = [job.supervisor.manager, *job.supervisor.engines.values(),
                      *(job.supervisor.cells.actor(c) for c in job.supervisor.cells.alive_ids())]
            for actor in actors:
                with contextlib.suppress(Exception):
                    pids.append(actor_pid(actor, timeout_s=_PID_TIMEOUT_S))
        return pids

    def _die(self, job: TrainingJob, pids: list[int], **detail: Any) -> None:
        head = job.ledger.head(job.run_id)
        job.ledger.append(job.run_id, EventKind.FAULT_INJECTED, {
            **({"fault": self.fault} if self.fault else {}),
            "scenario": self.scenario, "point": self.point, "step": self.step,
            "fired_at": utcnow_naive().isoformat(), "version_before": head.version,
            "detail": {**detail, "killed_pids": len(pids), "seq_at_fault": head.seq},
        })
        for pid in reversed(pids):  # the driver last: it sends the signals
            os.kill(pid, signal.SIGKILL)


def run_whole_job_crash(ctx: DrillContext, config: RunConfig, runs_dir: Path, what: str,
                        deadline_s: float) -> list[str]:
    """Run the job in a child that crashes at ``ctx.plan``'s point, then resume it from a
    second child. Fills ``ctx.record`` from the child's ``fault_injected``; returns problems
    with the runs themselves (the checker judges the ledger afterwards)."""
    spec = runs_dir / f"{config.run_id}.crash.json"
    spec.write_text(json.dumps({
        "config": config.model_dump(mode="json"), "runs_dir": str(runs_dir),
        "scenario": ctx.plan.scenario, "point": ctx.plan.point, "step": ctx.plan.step,
        "what": what,
    }))
    log = runs_dir / f"{config.run_id}.crash.log"
    code = _run([sys.executable, "-m", "orchestrator.drills.crash", str(spec)], log,
                deadline_s)
    if code != -signal.SIGKILL:
        return [f"the job was not killed (exit {code}): {_tail(log)}"]
    fault = _fault_event(ctx.ledger, ctx.run_id)
    if fault is None:
        return ["the child died without recording its fault"]
    ctx.record.fired = True
    ctx.record.fired_at = fault.recorded_at
    ctx.record.seq_at_fault = int(fault.payload["detail"]["seq_at_fault"])
    ctx.record.version_before = int(fault.payload["version_before"])
    ctx.record.detail.update(fault.payload["detail"])
    log = runs_dir / f"{config.run_id}.resume.log"
    code = _run([sys.executable, "-c", "from orchestrator.cli import main; main()", "run",
                 "--resume", "--run-id", config.run_id, "--db", config.db,
                 "--runs-dir", str(runs_dir), "--no-progress", *_job_flags(config)], log,
                deadline_s)
    if code != 0:
        return [f"the resume failed (exit {code}): {_tail(log)}"]
    return []


def expect_prompts_once(ledger: Ledger, run_id: str) -> list[str]:
    """From the ledger alone: no prompt trained twice, none both trained and dropped, every
    issued prompt trained, dropped or in flight."""
    prompts = prompt_ledger(ledger.events(run_id))
    problems = []
    if prompts.twice:
        problems.append(f"prompts trained twice: {sorted(prompts.twice)[:10]}")
    both = set(prompts.trained) & set(prompts.dropped)
    if both:
        problems.append(f"prompts both trained and dropped: {sorted(both)[:10]}")
    return problems


def _job_flags(config: RunConfig) -> list[str]:
    """The flags that rebuild ``config`` (the fields a drill sets)."""
    fields = ("rollout_batch_size", "n_samples_per_prompt", "async_max_concurrent_samples",
              "num_rollout", "num_cells", "num_engines", "save_interval",
              "heartbeat_timeout_s", "seed")
    return [arg for name in fields
            for arg in (f"--{name.replace('_', '-')}", str(getattr(config, name)))]


def _run(command: list[str], log: Path, deadline_s: float) -> int:
    """Run ``command`` to its end (output to ``log``: a pipe would stay open as long as any
    process the job started, such as Ray's, keeps it); returns its exit code.

    Raises:
        subprocess.TimeoutExpired: it did not end within ``deadline_s`` (it is killed).
    """
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    with log.open("w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            process.kill()
            raise


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-500:] if log.exists() else ""


def _fault_event(ledger: Ledger, run_id: str):
    faults = [e for e in ledger.events(run_id) if e.kind == EventKind.FAULT_INJECTED]
    return faults[-1] if faults else None


def _child(spec_path: str) -> None:
    """The crashing child: run the job with :class:`CrashHooks` (it never returns normally)."""
    from orchestrator.control.driver import JobOptions, run_job

    spec = json.loads(Path(spec_path).read_text())
    config = RunConfig(**spec["config"])
    hooks = CrashHooks(spec["scenario"], spec["point"], int(spec["step"]), spec["what"])
    run_job(config, JobOptions(runs_dir=Path(spec["runs_dir"]), progress=False, plot=False,
                               hooks=hooks))


if __name__ == "__main__":
    _child(sys.argv[1])
