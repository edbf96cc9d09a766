"""The main job: fully-async GRPO across indep-dp cells and rollout engines, on the ledger.

The story of a run (:meth:`TrainingJob.run`): open the run in the ledger, start engines and
cells, promote a publisher, restore a checkpoint when resuming, start the rollouts, then loop
(drain a batch, train, publish weights, checkpoint, record metrics) and finish with an audit.

Fully-async (miles ``train_async``): the drain of step r+1 is requested before step r trains,
and the rollout producer keeps the engines busy throughout; staleness is bounded by the data
buffer against the ledger's version. ``--sync`` drains a batch only after the previous step
published, and the producer runs only while a drain waits: the comparison baseline.
"""

from __future__ import annotations

import json
import logging
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from ledger import Ledger, LedgerError
from orchestrator.control import launch
from orchestrator.control.cells import CellGroup, EngineLostError, StepFailedError
from orchestrator.config import RunConfig
from orchestrator.control.launch import StartupError
from orchestrator.control.progress import RunProgress
from orchestrator.rollout.types import RolloutFnTrainOutput

__all__ = ["JobOptions", "JobResult", "StartupError", "TrainingJob", "new_run_id", "run_job"]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
_ENGINE_RESTARTS_PER_UPDATE = 3
PLOT_FILE = "run.png"
STALENESS_PREFIX = "rollout/fully_async/"

StepHook = Callable[["TrainingJob", int], None]
EngineFactory = Callable[[RunConfig, str], Any]


@dataclass(frozen=True)
class JobOptions:
    """How to run a job (as opposed to what to train: that is the RunConfig).

    ``on_step(job, step)`` runs after each step's metrics are written: tests and drills use it
    to observe the job or to act on its processes from outside. ``engine_factory`` builds one
    rollout engine actor (benchmarks pass one that models generation on its own accelerator).
    """

    resume: bool = False
    ray_address: str | None = None
    runs_dir: Path = Path("runs")
    progress: bool = True
    plot: bool = True
    on_step: StepHook | None = None
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


def _step_of(path: Path) -> int:
    """The train step in a ``rollout-step-NNNNNN.json`` name."""
    return int(path.stem.rsplit("-", 1)[-1])


def new_run_id() -> str:
    """``run-YYYYmmdd-HHMMSS-xxxx``: sortable by start time, unique enough per machine."""
    return f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run_job(config: RunConfig, options: JobOptions = JobOptions()) -> JobResult:
    """Run (or resume) one training job to the end and return its summary.

    Raises:
        StartupError: bad topology, too few CPUs, a run to resume that does not exist.
        LedgerError: the ledger cannot be opened (unreachable database, bad URL).
    """
    run_id = config.run_id or new_run_id()
    run_dir = Path(options.runs_dir) / run_id
    default_ledger = run_dir / "ledger.db"
    if config.rollout_batch_size < config.num_cells:
        raise StartupError(
            f"rollout_batch_size {config.rollout_batch_size} cannot feed {config.num_cells} "
            "cells: every cell needs at least one group per step"
        )
    if not options.resume and config.db is None and default_ledger.exists():
        raise StartupError(f"run {run_id} already exists in {run_dir}; pass --resume")
    # Before the ledger is touched, so a job that cannot start writes nothing.
    launch.check_cpu_budget(config, options.ray_address)
    ledger_url = config.db or f"sqlite:///{default_ledger}"
    config = config.model_copy(update={"run_id": run_id, "db": ledger_url})
    ledger = Ledger.open(ledger_url)
    try:
        launch.init_ray(config, options.ray_address)
        job = TrainingJob(config, ledger, run_dir, options)
        try:
            return job.run()
        finally:
            job.shutdown()
    finally:
        ledger.close()


class TrainingJob:
    """One run's actors and loop. Build with :func:`run_job`."""

    def __init__(self, config: RunConfig, ledger: Ledger, run_dir: Path, options: JobOptions):
        assert config.run_id is not None and config.db is not None
        self.config = config
        self.run_id = config.run_id
        self.ledger_url = config.db
        self.ledger = ledger
        self.run_dir = run_dir
        self.options = options
        self.metrics_path = run_dir / METRICS_FILE
        self.checkpoint_dir = run_dir / "checkpoints"
        self.engines: dict[str, Any] = {}
        self.cells: CellGroup | None = None
        self.manager: Any = None
        self.step = 0
        self.engine_restarts = 0
        self.manager_replacements = 0
        # Per-manager counters restart with a replacement manager; the run's total does not.
        self._negative_staleness_carried = 0
        self._negative_staleness_current = 0
        self._rewards: list[float] = []
        self._started = time.monotonic()

    # ------------------------------------------------------------------ the story

    def run(self) -> JobResult:
        """Open the run, start everything, train ``num_rollout`` steps, finish with an audit."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        first_step = self.open_run()
        self.start_engines()
        self.start_cells()
        if self.options.resume:
            first_step = self.restore_checkpoint()
        else:
            self.cells.ensure_publisher(reason="start")
        self.start_rollouts(first_step)
        with RunProgress(self.config.num_rollout, first_step, enabled=self.options.progress) as bar:
            self.train(first_step, bar)
        return self.finish()

    def open_run(self) -> int:
        """Start the run in the ledger (or check it exists when resuming)."""
        if self.options.resume:
            try:
                self.ledger.head(self.run_id)
            except LedgerError:
                raise StartupError(f"run {self.run_id} is not in {self.ledger.url}; "
                                   "nothing to resume") from None
            return 0
        self.ledger.start_run(self.run_id, config=self.config.model_dump(mode="json"))
        return 0

    def start_engines(self) -> None:
        self.engines = {
            f"engine-{i}": self.options.engine_factory(self.config, f"engine-{i}")
            for i in range(self.config.num_engines)
        }
        ray.get([engine.health.remote() for engine in self.engines.values()])

    def start_cells(self) -> None:
        self.cells = CellGroup(self.config, self.ledger, self.ledger_url, self.run_id,
                               launch.create_cell)
        self.cells.start()

    def restore_checkpoint(self) -> int:
        """Load the newest checkpoint into every cell, promote a publisher for this process
        (a new epoch fences whatever the stopped job left running), and publish the restored
        weights: the version is ledger head + 1 even when the checkpoint is older than head."""
        checkpoint = self._newest_checkpoint()
        if checkpoint is None:
            raise StartupError(f"run {self.run_id} has no checkpoint to resume from")
        self.cells.take_over(reason="resume")
        summary = self.cells.load_checkpoint(checkpoint.payload["path"])
        head = self.ledger.head(self.run_id)
        self.ledger.append(self.run_id, "run_resumed", {
            "checkpoint_step": summary["train_step"],
            "checkpoint_version": summary["version"],
            "head_version": head.version,
        })
        version = self.publish()
        logger.info("resumed %s from step %d (v%d); published as v%d", self.run_id,
                    summary["train_step"], summary["version"], version)
        self._manager_state_to_load = self._manager_state_path(summary["train_step"])
        return int(summary["train_step"])

    def start_rollouts(self, first_step: int) -> None:
        self.manager = launch.create_rollout_manager(
            self.config, self.ledger_url, self.run_id, self.engines
        )
        state = getattr(self, "_manager_state_to_load", None)
        if state is not None and state.exists():
            ray.get(self.manager.load.remote(str(state)))

    def train(self, first_step: int, bar: RunProgress) -> None:
        """The loop: drain, train, publish, checkpoint, record. Async mode requests the next
        drain before training on the current batch."""
        config = self.config
        pending = self.manager.generate.remote(first_step)
        for step in range(first_step, config.num_rollout):
            self.step = step
            step_started = time.monotonic()
            output: RolloutFnTrainOutput = self._await_batch(pending, step)
            timings = {"time/drain_wait_s": time.monotonic() - step_started}
            last = step + 1 == config.num_rollout
            if not config.sync and not last:
                pending = self.manager.generate.remote(step + 1)
            self._maintain_cells()
            train_started = time.monotonic()
            train_metrics = self.cells.train_step(output.samples)
            timings["time/train_s"] = time.monotonic() - train_started
            restarted = self._restart_dead_engines()
            version = None
            if restarted or (step + 1) % config.update_weights_interval == 0 or last:
                update_started = time.monotonic()
                version = self.publish(restarted)
                timings["time/update_weights_s"] = time.monotonic() - update_started
            if (step + 1) % config.save_interval == 0 and not last:
                self.save_checkpoint(step + 1)
            # Healing builds new actors (seconds): after the step's commit, not before it.
            self.cells.heal_lost()
            if config.sync and not last:
                pending = self.manager.generate.remote(step + 1)
            record = self._step_record(step, output, train_metrics, version, step_started)
            record.update({key: round(value, 4) for key, value in timings.items()})
            self._write_metrics(record)
            bar.update(record)
            if self.options.on_step is not None:
                self.options.on_step(self, step)

    def _await_batch(self, pending: Any, step: int) -> RolloutFnTrainOutput:
        """Wait for the drain of ``step`` while watching the processes it depends on.

        A publisher that dies mid-update leaves the engines paused, so the drain could wait
        for ever: every ``heartbeat_timeout_s`` the cells are heartbeated, and after a loss
        the group fails over and the new publisher publishes (which resumes the engines). A
        dead rollout manager is replaced from its newest saved state and asked again.
        """
        while True:
            ready, _ = ray.wait([pending], timeout=self.config.heartbeat_timeout_s)
            if not ready:
                if self._maintain_cells():
                    self.publish()
                continue
            try:
                return ray.get(pending)
            except RayActorError as exc:
                if isinstance(exc, RayTaskError):  # the manager raised: not its death
                    raise
                if not self._manager_alive():  # else it was replaced since this request
                    logger.warning("rollout manager lost (%s); replacing it",
                                   type(exc).__name__)
                    self.replace_manager()
                pending = self.manager.generate.remote(step)

    def _manager_alive(self) -> bool:
        try:
            ray.get(self.manager.get_weight_version.remote(), timeout=60)
        except RayActorError:
            return False
        return True

    def _call_manager(self, method: str, *args: Any) -> Any:
        """Call the rollout manager; if it is dead, replace it and call the new one once."""
        try:
            return ray.get(getattr(self.manager, method).remote(*args))
        except RayActorError as exc:
            if isinstance(exc, RayTaskError):
                raise
            logger.warning("rollout manager lost (%s); replacing it", type(exc).__name__)
            self.replace_manager()
            return ray.get(getattr(self.manager, method).remote(*args))

    def replace_manager(self) -> None:
        """Start a new rollout manager over the current engines and restore the newest saved
        prompt state (a checkpoint's); its version comes from the ledger head.

        Raises:
            StartupError: the new manager cannot start (run missing from the ledger).
        """
        try:
            ray.kill(self.manager, no_restart=True)
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        self.manager = launch.create_rollout_manager(
            self.config, self.ledger_url, self.run_id, self.engines
        )
        self._negative_staleness_carried += self._negative_staleness_current
        self._negative_staleness_current = 0
        saved = sorted(self.checkpoint_dir.glob("rollout-step-*.json"))
        saved = [path for path in saved if _step_of(path) <= self.step]
        if saved:
            ray.get(self.manager.load.remote(str(saved[-1])))
        self.manager_replacements += 1

    def publish(self, restarted: list[str] | None = None) -> int:
        """Publish the publisher's weights to every engine as the next version; returns it.

        An engine that dies during the update is restarted and the update is made again (the
        first attempt committed nothing). Restarted engines (``restarted``, and any restarted
        here) are handed to the rollout manager only once they hold the new version: a new
        engine starts with version-0 weights.

        Raises:
            StepFailedError: engines kept dying, or the cells could not publish.
        """
        restarted = list(restarted or [])
        for _ in range(_ENGINE_RESTARTS_PER_UPDATE):
            try:
                version = self.cells.update_weights(list(self.engines.values()), self.manager)
                break
            except EngineLostError as exc:
                logger.warning("%s; restarting dead engines and publishing again", exc)
                restarted += self._restart_dead_engines()
        else:
            raise StepFailedError("engines kept dying during the weight update")
        if self.manager is not None:
            for engine_id in restarted:
                self._call_manager("replace_engine", engine_id, self.engines[engine_id])
        return version

    def _restart_dead_engines(self) -> list[str]:
        """Replace engines Ray reports dead with new actors (not yet serving); returns their
        ids. The caller must publish the current weights to them before the manager uses
        them: a new engine starts at version 0."""
        refs = {engine_id: engine.health.remote() for engine_id, engine in self.engines.items()}
        dead = []
        for engine_id, ref in refs.items():
            try:
                ray.get(ref, timeout=self.config.heartbeat_timeout_s + 30)
            except RayActorError:
                dead.append(engine_id)
        for engine_id in dead:
            logger.warning("engine %s is dead; starting a replacement", engine_id)
            try:
                ray.kill(self.engines[engine_id], no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self.engines[engine_id] = self.options.engine_factory(self.config, engine_id)
        if dead:
            ray.get([self.engines[engine_id].health.remote() for engine_id in dead])
            self.engine_restarts += len(dead)
        return dead

    @property
    def negative_staleness_total(self) -> int:
        """Negative staleness values counted in this run, across rollout-manager replacements
        (DESIGN invariant 6: must stay 0)."""
        return self._negative_staleness_carried + self._negative_staleness_current

    def _maintain_cells(self) -> bool:
        """Heartbeat the cells; after a loss, promote a publisher if needed and re-form the
        quorum over the survivors (they are healed at the end of the step). Returns whether
        a cell was lost."""
        lost = self.cells.check_liveness()
        if lost:
            self.cells.ensure_publisher()
            self.cells.reform()
        return bool(lost)

    def save_checkpoint(self, train_step: int) -> None:
        path = self.checkpoint_dir / f"step-{train_step:06d}.pt"
        self.cells.save_checkpoint(str(path))
        self._call_manager("save", str(self._manager_state_path(train_step)))

    def _manager_state_path(self, train_step: int) -> Path:
        return self.checkpoint_dir / f"rollout-step-{train_step:06d}.json"

    def _newest_checkpoint(self):
        newest = None
        for event in self.ledger.events(self.run_id):
            if event.kind == "checkpoint_saved":
                newest = event
        return newest

    # ------------------------------------------------------------------ records

    def _step_record(self, step: int, output: RolloutFnTrainOutput, train: dict[str, float],
                     version: int | None, started: float) -> dict[str, Any]:
        rewards = [s.reward for group in output.samples for s in group]
        reward_mean = statistics.fmean(rewards) if rewards else 0.0
        self._rewards.append(reward_mean)
        head = self.ledger.head(self.run_id)
        seconds = time.monotonic() - started
        record: dict[str, Any] = {
            "step": step + 1,
            "time": datetime.now(UTC).isoformat(),
            "wall_s": round(time.monotonic() - self._started, 3),
            "step_s": round(seconds, 4),
            "samples": len(rewards),
            "samples_per_s": round(len(rewards) / seconds, 2) if seconds > 0 else None,
            "reward/mean": reward_mean,
            "weight_version": head.version,
            "published_version": version,
            "epoch": head.epoch,
            "publisher": head.publisher_cell,
            "cells_alive": len(self.cells.alive_ids()),
            "quorum_id": self.cells.quorum_id,
        }
        record.update({f"train/{k}": v for k, v in train.items()})
        record.update(output.metrics)
        self._negative_staleness_current = int(
            output.metrics.get(STALENESS_PREFIX + "negative_staleness_total", 0)
        )
        record["negative_staleness_run_total"] = self.negative_staleness_total
        return record

    def _write_metrics(self, record: dict[str, Any]) -> None:
        with self.metrics_path.open("a", encoding="utf-8") as sink:
            sink.write(json.dumps(record, default=str) + "\n")

    # ------------------------------------------------------------------ the end

    def finish(self) -> JobResult:
        """Record ``run_finished``, audit the ledger, draw the plot, and summarise."""
        manager_metrics = self._call_manager("metrics")
        self._negative_staleness_current = int(
            manager_metrics.get(STALENESS_PREFIX + "negative_staleness_total", 0)
        )
        negative = self.negative_staleness_total
        self.ledger.append(self.run_id, "run_finished", {
            "steps": self.config.num_rollout,
            "negative_staleness_total": negative,
            "prompts_unaccounted": manager_metrics.get("rollout_manager/prompts_unaccounted", 0),
        })
        report = self.ledger.verify(self.run_id)
        plot_path = None
        if self.options.plot:
            plot_path = self._draw_plot()
        head = self.ledger.head(self.run_id)
        window = max(1, min(5, len(self._rewards) // 4 or 1))
        promotions = sum(1 for e in self.ledger.events(self.run_id) if e.kind == "cell_promoted")
        return JobResult(
            run_id=self.run_id,
            run_dir=self.run_dir,
            ledger_url=self.ledger_url,
            metrics_path=self.metrics_path,
            plot_path=plot_path,
            steps=len(self._rewards),
            head_version=head.version,
            wall_s=time.monotonic() - self._started,
            reward_first=statistics.fmean(self._rewards[:window]) if self._rewards else 0.0,
            reward_last=statistics.fmean(self._rewards[-window:]) if self._rewards else 0.0,
            promotions=promotions,
            negative_staleness_total=negative,
            audit_problems=[str(p) for p in report.problems],
        )

    def _draw_plot(self) -> Path | None:
        from ledger.cli.plot import plot_run

        path = self.run_dir / PLOT_FILE
        try:
            plot_run(self.ledger_url, self.run_id, path, metrics=self.metrics_path)
        except Exception:  # noqa: BLE001 - a plot must never fail a finished run
            logger.warning("could not draw %s", path, exc_info=True)
            return None
        return path

    def shutdown(self) -> None:
        """Stop the producer, the cells and the engines (best effort)."""
        if self.manager is not None:
            try:
                ray.get(self.manager.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001
                logger.debug("rollout manager shutdown failed", exc_info=True)
            ray.kill(self.manager, no_restart=True)
        if self.cells is not None:
            self.cells.stop()
        for engine in self.engines.values():
            try:
                ray.kill(engine, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
