"""The main job: fully-async GRPO across indep-dp cells and rollout engines, on the ledger.

The story of a run (:meth:`TrainingJob.run`): open the run in the ledger, start engines and
cells, promote a publisher (or restore a checkpoint when resuming), start the rollouts, then
loop (drain a batch, train, publish weights, checkpoint, record) and finish with an audit.
Liveness, failover and replacement are the supervisor's; publishing is the publisher's.

Fully-async (miles ``train_async``): the drain of step r+1 is requested before step r trains,
and the rollout producer keeps the engines busy throughout; staleness is bounded by the data
buffer against the ledger's version. ``--sync`` drains a batch only after the previous step
published, and the producer runs only while a drain waits: the comparison baseline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ledger import Event, EventKind, Head, Ledger, LedgerError
from ledger.audit.witness import Witness, write_checkpoint_witness
from ledger.run_layout import RunLayout, default_ledger_url
from orchestrator.config import RunConfig
from orchestrator.control import evaluation, launch, task_setup
from orchestrator.control.engine_pool.vllm_launch import plan_model
from orchestrator.control.job_options import JobOptions, JobResult, StepHooks, new_run_id
from orchestrator.control.provenance_recorder import ProvenanceRecorder
from orchestrator.control.publisher import Publisher
from orchestrator.control.reporting.progress import RunProgress
from orchestrator.control.reporting.step_phases import StepPhases
from orchestrator.control.reporting.step_record import StepRecorder
from orchestrator.control.reporting.tracking import open_tracker
from orchestrator.control.resume_checks import check_witnesses, require_run
from orchestrator.control.supervision import Supervisor
from orchestrator.control.supervision.manager_watch import Drain
from orchestrator.errors import StartupError
from orchestrator.metric_keys import NEGATIVE_STALENESS_KEY, PROMPTS_UNACCOUNTED_KEY, metric_key
from orchestrator.rollout.types import RolloutFnTrainOutput

__all__ = ["JobOptions", "JobResult", "StartupError", "TrainingJob", "new_run_id", "run_job"]

logger = logging.getLogger(__name__)


def run_job(config: RunConfig, options: JobOptions = JobOptions()) -> JobResult:
    """Run (or resume) one training job to the end and return its summary.

    Raises:
        StartupError: bad topology, too few CPUs or GPUs, a run to resume that does not exist, a
            ledger URL the cluster's nodes cannot share, an unreadable checkpoint to resume.
        LedgerError: the ledger cannot be opened (unreachable database, bad URL).
        StepFailedError, SupervisionLimitError: the run failed; ``run_failed`` is recorded.
    """
    logger.info("start-up: run_job entered at %.3f", time.time())  # bench/startup.py reads it
    run_id = config.run_id or new_run_id()
    layout = RunLayout.of(options.runs_dir, run_id)
    if not options.resume and config.db is None and layout.ledger_path.exists():
        raise StartupError(f"run {run_id} already exists in {layout.run_dir}; pass --resume")
    if options.resume:  # before anything is written or started: a typo must leave no trace
        require_run(config.db or layout.ledger_url, run_id, layout)
    # Before the ledger is touched, so a job that cannot start writes nothing.
    launch.check_cpu_budget(config, options.ray_address)
    launch.check_gpu_budget(config, options.ray_address)
    config = task_setup.prepare(config)  # the data, tokenizer and reward, checked
    # Absolute: the actors open it too, and a worker's directory is not the driver's.
    ledger_url = config.db or default_ledger_url(layout.run_dir.resolve())
    config = config.model_copy(update={"run_id": run_id, "db": ledger_url})
    model = plan_model(config, layout.run_dir)  # --engine vllm: the Llama every actor loads
    config = model.config
    launch.check_cluster_ledger(config, ledger_url, options.ray_address)
    with contextlib.ExitStack() as cleanup:  # undone in reverse: job, model, preload, ledger
        ledger = Ledger.open(ledger_url)
        cleanup.callback(ledger.close)
        # Every check that can refuse the run is done: torch (for the cells' rendezvous store)
        # loads, and the task model of a vLLM run is made, while Ray starts. Not while the
        # ledger opens: the import would hold the interpreter lock the ledger's migrations
        # need, and Ray would start later.
        preload = launch.preload_in_background("torch.distributed")
        cleanup.callback(preload.join)
        background = cleanup.enter_context(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-ledger-model"))
        model_made = background.submit(model.make)
        logger.info("start-up: ray.init called at %.3f", time.time())
        launch.init_ray(config, options.ray_address)
        logger.info("start-up: ray.init returned at %.3f", time.time())
        model_made.result()  # StartupError: the task model cannot be made
        config = launch.resolve_devices(config)  # auto -> cuda/cpu, GPUs per actor
        job = TrainingJob(config, ledger, layout, options)
        cleanup.callback(job.shutdown)
        try:
            return job.run()
        except Exception as exc:
            if not isinstance(exc, StartupError):
                job.record_failure(exc)
            raise


class TrainingJob:
    """One run's actors and loop. Build with :func:`run_job`."""

    def __init__(self, config: RunConfig, ledger: Ledger, layout: RunLayout,
                 options: JobOptions) -> None:
        if config.run_id is None or config.db is None:
            raise ValueError("TrainingJob needs a config with run_id and db set (run_job does)")
        self.config = config
        self.run_id = config.run_id
        self.ledger_url = config.db
        self.ledger = ledger
        self.layout = layout
        self.options = options
        self.hooks = StepHooks(options.hooks, options.on_step)
        self.supervisor = Supervisor(config, ledger, layout,
                                     create_engine=options.engine_factory)
        self.publisher = Publisher.of(self.supervisor,
                                      before_publish=lambda: self.hooks.before_publish(self),
                                      finish_in_background=True)
        self.tracker = open_tracker(config, layout.run_dir)
        self.evaluator = evaluation.Evaluator(config, ledger, self.run_id, self.tracker)
        self.recorder = StepRecorder(layout.metrics_path, self.run_id, tracker=self.tracker)
        self.provenance = ProvenanceRecorder(ledger, self.run_id)
        self.step = 0

    # Shorthands for tests and drills that act on the job's actors.
    @property
    def cells(self):  # noqa: ANN201 - CellGroup
        return self.supervisor.cells

    @property
    def engines(self) -> dict[str, Any]:
        return self.supervisor.engines

    @property
    def manager(self) -> Any:
        return self.supervisor.manager

    @property
    def negative_staleness_total(self) -> int:
        """Negative staleness values counted in this run (DESIGN invariant 6: must stay 0)."""
        return self.supervisor.negative_staleness_total

    # ------------------------------------------------------------------ the story

    def run(self) -> JobResult:
        """Open the run, start everything, train ``num_rollout`` steps, finish with an audit."""
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        self.open_run()
        self.tracker.start(self.config, self.run_id, self.ledger.head(self.run_id))
        self.supervisor.start_engines_and_cells(with_manager=not self.options.resume)
        first_step = 0
        if self.options.resume:
            first_step = self.restore_checkpoint()
        else:
            self.supervisor.ensure_publisher(reason="start")
        self.supervisor.start_manager(restore=self.options.resume)
        with RunProgress(self.config.num_rollout, first_step, enabled=self.options.progress) as bar:
            self.train(first_step, bar)
        return self.finish()

    def open_run(self) -> None:
        """Start the run in the ledger (or check it exists when resuming)."""
        if not self.options.resume:
            # The ledger redacts credentials (a URL's password) before they are recorded.
            self.ledger.start_run(self.run_id, config=task_setup.started_config(self.config))
            return
        try:
            self.ledger.head(self.run_id)
        except LedgerError:
            raise StartupError(f"run {self.run_id} is not in {self.ledger.url}; "
                               "nothing to resume") from None
        check_witnesses(self.ledger, self.run_id, self.layout)  # before anything is written
        task_setup.check_dataset_identity(self.ledger, self.run_id, self.config)

    def restore_checkpoint(self) -> int:
        """Load the newest checkpoint into every cell, take over with a new epoch (fencing
        whatever the stopped job left running), rebuild the prompt stream from the ledger,
        record ``run_resumed`` and publish the restored weights: the version is ledger head + 1
        even when the checkpoint is older than head.

        Returns the step to continue from (the ledger's last trained step: steps after the
        checkpoint are not trained again, their weight updates are what the rollback loses).
        The rollout manager started next rebuilds its prompt stream from the same ledger.
        """
        progress = self.ledger.progress(self.run_id)  # newest snapshot + the events after it
        if progress.last_checkpoint is None:
            raise StartupError(f"run {self.run_id} has no checkpoint to resume from")
        checkpoint_path = progress.last_checkpoint["payload"]["path"]
        # Readable by the driver and every cell, or nothing is promoted (one line, exit 2).
        self.supervisor.storage.require_readable(checkpoint_path, self.supervisor.cells)
        self.supervisor.take_over(reason="resume")
        summary = self.supervisor.cells.load_checkpoint(checkpoint_path)
        prompts = progress.prompts  # what the manager will restore from the ledger
        self.provenance.forget_dropped(prompts.dropped)
        step = max(int(summary["train_step"]), prompts.last_step)
        self.ledger.append(self.run_id, EventKind.RUN_RESUMED, {
            "checkpoint_step": summary["train_step"],
            "checkpoint_version": summary["version"],
            "head_version": self.ledger.head(self.run_id).version,
            "ledger_step": prompts.last_step,
            "prompts_carried_over": len(prompts.in_flight),
            "next_prompt_index": prompts.next_index,
        })
        outcome = self.publisher.publish_weights()
        logger.info("resumed %s at step %d from checkpoint step %d (v%d); published as v%d",
                    self.run_id, step, summary["train_step"], summary["version"],
                    outcome.version)
        return step

    def train(self, first_step: int, bar: RunProgress) -> None:
        """The loop: drain, train, publish, checkpoint, record. Fully-async requests the drain
        of step r+1 as soon as step r's batch is out, before r trains (the prefetch).

        Every phase's wall seconds go in the step's record (``time/<phase>_s``, and the
        update's own steps as ``time/update/<step>_s``); ``time/control_plane_s`` is the step
        less the train step and the drain wait (:mod:`.reporting.step_phases`).
        """
        supervisor = self.supervisor
        held_version = self.ledger.head(self.run_id).version  # what the trainer's weights are
        next_drain: Drain | None = supervisor.request_drain(first_step)
        for step in range(first_step, self.config.num_rollout):
            self.step = step
            step_started = time.monotonic()
            phases = StepPhases()
            with phases.timed("begin_step"):  # begin_step reads its answers
                supervisor.send_heartbeat()
            with phases.timed("drain_wait"):
                batch = self._drain(next_drain or supervisor.request_drain(step))
                next_drain = self._prefetch(step + 1)

            with phases.timed("begin_step"):  # the cells' heartbeat, the engine probe sent
                supervisor.begin_step(batch)
            with phases.timed("train"):
                train_metrics = self.train_step(step, batch)

            version = None
            if supervisor.engines_awaiting_weights or self._publish_due(step):
                with phases.timed("update_weights"):
                    outcome = self.publisher.publish_weights()
                version = outcome.version
                phases.add_update(outcome.step_seconds)
            trained_on = held_version
            with phases.timed("provenance"):
                recorded = self.record_provenance(step, batch, trained_on, version)
            held_version = version or held_version
            head = self._head_at(recorded, held_version)  # passed on, never read back
            with phases.timed("evaluate"):
                if self.evaluator.due(step):
                    self.publisher.settle()  # the engines serve the version evaluated
                self.evaluator.after_step(step, supervisor.engines)  # when due
            if self._checkpoint_due(step):
                with phases.timed("checkpoint"):
                    self.save_checkpoint(step + 1)
            with phases.timed("end_step"):
                supervisor.end_step()
            step_s = time.monotonic() - step_started
            bar.update(self.record(step, batch, train_metrics, head, trained_on, version,
                                   step_s, phases.timings(step_s)))
            self.hooks.on_step_end(self, step)
        self.publisher.settle()  # the last update's engines_stamped before run_finished
        supervisor.settle_version_push()  # the last step's push, if end_step did not see it

    def _drain(self, drain: Drain) -> RolloutFnTrainOutput:
        with task_setup.reward_errors_end_the_run():
            return self.supervisor.await_drain(drain)

    def _prefetch(self, step: int) -> Drain | None:
        """Fully-async: ask for the batch of ``step`` now; ``--sync``: not until it is due."""
        if self.config.sync or step >= self.config.num_rollout:
            return None
        return self.supervisor.request_drain(step)

    def train_step(self, step: int, batch: RolloutFnTrainOutput) -> dict[str, float]:
        """Train ``step`` on ``batch`` between the job's two train hooks."""
        self.hooks.before_train_step(self, step)
        try:
            return self.supervisor.train_step(batch.samples)
        finally:
            self.hooks.after_train_step(self, step)

    def _publish_due(self, step: int) -> bool:
        last = step + 1 == self.config.num_rollout
        return last or (step + 1) % self.config.update_weights_interval == 0

    def _checkpoint_due(self, step: int) -> bool:
        last = step + 1 == self.config.num_rollout
        return not last and (step + 1) % self.config.save_interval == 0

    def save_checkpoint(self, train_step: int) -> None:
        """The publisher saves the cells' weights and optimizer state. The prompt stream needs
        no checkpoint: the ledger's ``batch_trained`` events are its record."""
        path = self.layout.checkpoint_path(train_step)  # its witness stays in the run directory
        self.publisher.save_checkpoint(self.supervisor.storage.checkpoint_url(train_step))
        path.parent.mkdir(parents=True, exist_ok=True)  # with --checkpoint-dir elsewhere
        write_checkpoint_witness(path, Witness.of_head(self.run_id, self.ledger.head(self.run_id)))

    def record_provenance(self, step: int, batch: RolloutFnTrainOutput, trainer_version: int,
                          produced_version: int | None) -> Event:
        """Append the step's ``batch_trained`` event (what it trained, on which versions, and
        the prompts it settled) and return it; from then on its prompts are on record as
        trained. The prompt position comes with the batch (as its drain ended), so this is
        one ledger append and no call to the rollout manager."""
        position = batch.prompt_position
        assert position is not None, "every drained batch comes from RolloutManager.generate"
        return self.provenance.record(
            step + 1, batch, trainer_version=trainer_version,
            produced_version=produced_version, cells=self.supervisor.cells.alive_ids(),
            drain_version=int(batch.metrics.get(metric_key("weight_version"), trainer_version)),
            dropped_prompts=position.dropped, next_index=position.next_index,
            recycled=int(batch.metrics.get(metric_key("recycled"), 0)),
        )

    def _head_at(self, recorded: Event, version: int) -> Head:
        """The ledger head right after ``recorded``, from what this process holds: the version
        it committed last and the publisher it promoted (no ledger read)."""
        publisher = self.supervisor.failover.publisher
        if publisher is None:  # pragma: no cover - a publisher is promoted before step 1
            return self.ledger.head(self.run_id)
        return Head(version, publisher[1], publisher[0], recorded.seq, recorded.hash)

    def record(self, step: int, batch: RolloutFnTrainOutput, train: dict[str, float],
               head: Head, trained_on: int, version: int | None, step_s: float,
               timings: dict[str, float]) -> dict[str, Any]:
        """Write the step's metrics line (its witness: ``head``; ``trained_on``: the version
        the batch trained on); returns it."""
        self.supervisor.note_negative_staleness(int(batch.metrics.get(NEGATIVE_STALENESS_KEY, 0)))
        record = self.recorder.record(
            step, batch, train, head, trainer_version=trained_on, published_version=version,
            cells_alive=len(self.supervisor.cells.alive_ids()),
            quorum_id=self.supervisor.cells.quorum_id, step_s=step_s,
            timings=timings, negative_staleness_total=self.negative_staleness_total,
        )
        # Promotions, failovers, resumes: markers in the trackers at the step they were seen.
        self.tracker.follow_ledger(self.ledger, self.run_id, step + 1)
        return record

    # ------------------------------------------------------------------ the end

    def finish(self) -> JobResult:
        """Record ``run_finished``, audit the ledger, draw the plot, and summarise."""
        manager_metrics = self.supervisor.call_manager(lambda manager: manager.metrics.remote())
        self.supervisor.note_negative_staleness(int(manager_metrics.get(NEGATIVE_STALENESS_KEY, 0)))
        self.ledger.append(self.run_id, EventKind.RUN_FINISHED, {
            "steps": self.config.num_rollout,
            "negative_staleness_total": self.negative_staleness_total,
            "prompts_unaccounted": manager_metrics.get(PROMPTS_UNACCOUNTED_KEY, 0),
        })
        # O(events since the last audit checkpoint); `make run` ends with a full `ledger verify`.
        report = self.ledger.verify_since_checkpoint(self.run_id)
        plot_path = self._draw_plot() if self.options.plot else None
        state = self.ledger.progress(self.run_id)
        reward_first, reward_last = self.recorder.reward_window()
        return JobResult(
            run_id=self.run_id, run_dir=self.layout.run_dir, ledger_url=self.ledger_url,
            metrics_path=self.layout.metrics_path, plot_path=plot_path,
            steps=len(self.recorder.rewards), head_version=state.head_version,
            wall_s=self.recorder.wall_s, reward_first=reward_first, reward_last=reward_last,
            promotions=state.promotions,
            negative_staleness_total=self.negative_staleness_total,
            audit_problems=[str(problem) for problem in report.problems],
        )

    def record_failure(self, error: BaseException) -> None:
        """Append the terminal ``run_failed`` (why, and the head version it ended at); best
        effort: a ledger that cannot take it is logged, the run's own error is what counts."""
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        try:
            self.ledger.append(self.run_id, EventKind.RUN_FAILED, {
                "reason": reason, "head_version": self.ledger.head(self.run_id).version})
        except LedgerError:
            logger.warning("could not record run_failed for %s", self.run_id, exc_info=True)

    def _draw_plot(self) -> Path | None:
        from ledger.cli.plot import plot_run

        path = self.layout.plot_path
        try:
            plot_run(self.ledger_url, self.run_id, path, metrics=self.layout.metrics_path)
        except Exception:  # noqa: BLE001 - a plot must never fail a finished run
            logger.warning("could not draw %s", path, exc_info=True)
            return None
        return path

    def shutdown(self) -> None:
        """Stop the producer, the cells and the engines (best effort); close the trackers."""
        self.supervisor.stop()
        self.tracker.finish(self.ledger, self.run_id, self.step + 1)
