"""Publishing weights: the one path from the driver to the engines, and checkpoints.

A weight update (DESIGN section 5) walks, with direct method calls:

1. :meth:`Publisher.publish_weights` (here): cell failover names the publisher cell and its
   epoch (cached; no ledger read unless a promotion or a fence happened).
2. ``TrainCell.update_weights`` (actors/train_cell.py), which runs the one sequence
   (actors/publishing/sequence.py):
   ``weight_update_started`` (ledger write 1), pause engines, transfer (full or LoRA, in
   actors/publishing/weight_sync.py), ``commit_weights`` (ledger write 2), and then, on the
   cell's update tail (actors/publishing/tail.py) while the cell goes on to its next train
   step, the one ``finalize_and_resume_engines(v, e)`` and ``engines_stamped`` (ledger
   write 3). The cell settles the tail before its next update or checkpoint;
   :meth:`Publisher.settle` waits for it where the control plane needs the engines stamped.
3. Back here: restarted engines are handed to the rollout manager once the tail has stamped
   them (they then hold ``v``), and ``v`` is pushed to the manager without waiting (its
   answer is checked at the step boundary, ``Supervisor.end_step``, if it is in, else before
   the next push); ``v`` is returned to the driver, which passes it on.

A failed attempt is sorted out and the update is made again under
:meth:`FailurePolicy.run`: a dead engine is restarted (nothing was committed), a lost
publisher is failed over (the successor transfers again and commits head + 1), a fenced
publisher re-reads the head. Every call on the publisher cell is bounded by the policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.exceptions import RayTaskError

from actors.transport import WeightSwap
from ledger import FencedError
from orchestrator.control.supervision.cell_failover import CellFailover
from orchestrator.control.supervision.cell_group import CellGroup, is_actor_loss, is_engine_loss
from orchestrator.control.supervision.engine_restarts import EngineRestarts
from orchestrator.control.supervision.failure_policy import FailurePolicy
from orchestrator.control.supervision.manager_watch import ManagerWatch
from orchestrator.errors import EngineLostError, PublisherLostError, RetryableFailure

if TYPE_CHECKING:
    from orchestrator.control.supervision import Supervisor

__all__ = ["PublishOutcome", "Publisher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishOutcome:
    """What one publish did: the committed version, who published it under which epoch, and
    the wall seconds of each step of the sequence (``UpdateReport.step_seconds``: started,
    stage, pause, load, commit, and stamp (and resume) and stamped unless they run on the
    cell's update tail; then ``tail_wait``, the wait for the last update's) plus
    ``hand_over`` (the version push to the rollout manager)."""

    version: int
    epoch: int
    publisher_cell: str
    step_seconds: dict[str, float] = field(default_factory=dict)


class Publisher:
    """Publishes the publisher cell's weights to every engine, and saves checkpoints.

    Args:
        cells: the run's cells (the publisher's actor handle).
        failover: names the publisher, and sorts out its loss or fencing.
        engines: the engines to publish to; restarts the dead ones.
        manager: the rollout manager watch (hand-over and the version push); ``None`` for a
            publisher without rollouts (tests).
        policy: the attempts and the bound on every call.
        before_publish: called before each attempt of an update (the job's hook): once, and
            again before a retry, after a failed attempt was sorted out (a lost publisher
            failed over), so a drill can act between a failover and the new publisher's
            first commit.
        swap: whether engines pause for an update or take it in flight
            (``RunConfig.weight_swap``).
        finish_in_background: an update returns once committed, and its steps 5-6 run on
            the publisher cell beside its next train step (:meth:`settle` waits for them);
            else :meth:`publish_weights` returns with every engine stamped. The training job
            finishes in the background; tests and drills that look at the engines right
            after a publish do not.
    """

    def __init__(self, cells: CellGroup, failover: CellFailover, engines: EngineRestarts,
                 manager: ManagerWatch | None, policy: FailurePolicy, *,
                 before_publish: Callable[[], None] = lambda: None,
                 swap: WeightSwap = WeightSwap.PAUSE,
                 finish_in_background: bool = False) -> None:
        self.swap = WeightSwap(swap)
        self.finish_in_background = finish_in_background
        self._cells = cells
        self._failover = failover
        self._engines = engines
        self._manager = manager
        self.policy = policy
        self._before_publish = before_publish
        self._finishing: str | None = None  # the cell whose update tail is not settled

    @classmethod
    def of(cls, supervisor: Supervisor, *, before_publish: Callable[[], None] = lambda: None,
           finish_in_background: bool = False) -> Publisher:
        """A publisher over ``supervisor``'s collaborators (its cells, failover, engines,
        manager watch and policy), each passed explicitly, swapping weights as its run's
        configuration says."""
        return cls(supervisor.cells, supervisor.failover, supervisor.engine_restarts,
                   supervisor.manager_watch, supervisor.policy, before_publish=before_publish,
                   swap=supervisor.config.weight_swap,
                   finish_in_background=finish_in_background)

    def publish_weights(self) -> PublishOutcome:
        """Publish as the next version (ledger head + 1) to every engine; returns the outcome.

        Precondition: the cells are started and a publisher was promoted. Retries under the
        failure policy (see the module docstring). Afterwards the restarted engines serve and
        the version push to the rollout manager is sent (its answer is checked at the step
        boundary).

        Raises:
            StepFailedError: ``max_attempts`` attempts failed.
            SupervisionLimitError: engines kept dying past the restart budget.
        """
        outcome = self.policy.run(self._attempt_sorted_out, "weight update failed")
        if self._manager is not None and self._manager.manager is not None:
            started = time.perf_counter()
            watch = self._manager
            if self._engines.awaiting_weights:
                self.settle()  # a restarted engine serves the manager once it is stamped
            self._engines.hand_over(lambda engine_id, handle: watch.call(
                lambda manager: manager.replace_engine.remote(engine_id, handle)))
            watch.push_version(outcome.version)  # answered by the step boundary
            outcome.step_seconds["hand_over"] = time.perf_counter() - started
        return outcome

    def _attempt_sorted_out(self) -> PublishOutcome:
        self._before_publish()
        try:
            return self.try_publish()
        except EngineLostError as exc:
            logger.warning("%s; restarting dead engines and publishing again", exc)
            replaced = self._engines.restart_dead()
            raise RetryableFailure(exc, recovered=bool(replaced)) from exc
        except (PublisherLostError, FencedError) as exc:
            failure = self._sorted_out(exc)
            raise failure from failure.cause

    def try_publish(self) -> PublishOutcome:
        """ONE attempt of :meth:`publish_weights`, without retries or hand-over (tests and
        drills call it to observe a single attempt).

        Raises:
            EngineLostError: an engine died, or gave no answer within the policy's
                ``engine_call_timeout_s``, before the commit; nothing was committed, the other
                engines stay paused until the next update (in flight: they keep serving the
                old weights).
            PublisherLostError: the publisher cell died or gave no answer in time.
            FencedError: the publisher was superseded.
            Exception: the publisher cell raised (its error, unwrapped from Ray's).
        """
        cell_id, epoch = self._failover.ensure_publisher()
        engines = list(self._engines.engines.values())
        self._finishing = None  # the cell settles its own tail first
        report = self._call(cell_id, self._cells.actor(cell_id).update_weights.remote(
            engines, epoch, self.policy.engine_call_timeout_s, str(self.swap),
            self.finish_in_background))
        self._finishing = cell_id if report.finishing else None
        return PublishOutcome(version=report.version, epoch=epoch, publisher_cell=cell_id,
                              step_seconds=dict(report.step_seconds))

    def settle(self) -> None:
        """Wait until the last update's engines are stamped and ``engines_stamped`` is
        recorded (steps 5-6, which run on the publisher cell beside its next train step).
        Nothing to wait for: returns at once.

        A publisher lost meanwhile is failed over (its version stays committed; engines it
        did not stamp are the audit's unstamped ones, and the next update reaches them).

        Raises:
            StepFailedError: ``max_attempts`` attempts failed.
            Exception: what the tail raised on the publisher cell.
        """
        if self._finishing is not None:
            self.policy.run(self._settle_attempt, "the last weight update did not finish")

    def _settle_attempt(self) -> None:
        cell_id, self._finishing = self._finishing, None
        if cell_id is None:
            return
        try:
            self._call(cell_id, self._cells.actor(cell_id).settle_update.remote(
                self.policy.engine_call_timeout_s))
        except PublisherLostError as exc:
            failure = self._sorted_out(exc)
            raise failure from failure.cause

    def save_checkpoint(self, path: Path) -> dict[str, Any]:
        """The publisher writes its state to ``path`` and records ``checkpoint_saved``.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed.
        """
        return self.policy.run(lambda: self._checkpoint_attempt(path),
                               f"checkpoint {path} could not be saved")

    def _checkpoint_attempt(self, path: Path) -> dict[str, Any]:
        cell_id, epoch = self._failover.ensure_publisher()
        try:
            return self._call(cell_id, self._cells.actor(cell_id).save_checkpoint.remote(
                str(path), epoch))
        except (PublisherLostError, FencedError) as exc:
            failure = self._sorted_out(exc)
            raise failure from failure.cause

    def _sorted_out(self, exc: PublisherLostError | FencedError) -> RetryableFailure:
        """Sort out a lost publisher (lose it) or a fenced one (promote afresh); returns the
        failure :meth:`FailurePolicy.run` retries."""
        if isinstance(exc, PublisherLostError):
            lost = self._lose(exc)
            return RetryableFailure(exc.cause, recovered=bool(lost))
        self._failover.ensure_publisher(refresh=True)
        return RetryableFailure(exc)

    def _call(self, cell_id: str, call: Any) -> Any:
        """Wait for the publisher's ``call`` (bounded); raise what its failure means."""
        results, failed = self._cells.call_each({cell_id: call}, self.policy.step_timeout_s)
        if cell_id in failed:
            raise _classify(cell_id, failed[cell_id])
        return results[cell_id]

    def _lose(self, lost: PublisherLostError) -> list[str]:
        """Fail the lost publisher over and re-form the quorum; returns the cells lost now."""
        cells = self._failover.lose({lost.cell_id: lost.cause})
        self._failover.reform()
        return cells


def _classify(cell_id: str, exc: BaseException) -> BaseException:
    """The error a failed publisher call means: engine lost, publisher lost, or its own."""
    if is_engine_loss(exc):
        return EngineLostError(f"an engine died during the update: {exc}")
    if is_actor_loss(exc):
        return PublisherLostError(cell_id, exc)
    if isinstance(exc, RayTaskError):
        return exc.as_instanceof_cause()
    return exc
