"""Publishing weights: the one path from the driver to the engines, and checkpoints.

A weight update (DESIGN section 5) walks, with direct method calls:

1. :meth:`Publisher.publish_weights` (here): the supervisor names the publisher cell and its
   epoch (cached; no ledger read unless a promotion or a fence happened).
2. ``TrainCell.update_weights`` (actors/train_cell.py), which runs the one sequence
   (actors/publishing/sequence.py):
   ``weight_update_started`` (ledger write 1), pause engines, transfer (full or LoRA, in
   actors/publishing/weight_sync.py), ``commit_weights`` (ledger write 2), the one
   ``finalize_and_resume_engines(v, e)``, ``engines_stamped`` (ledger write 3).
3. Back here: restarted engines are handed to the rollout manager (they now hold ``v``) and
   ``v`` is pushed to the manager.

A failed attempt is sorted out under the failure policy and the update is made again: a dead
engine is restarted (nothing was committed), a lost publisher is failed over (the successor
transfers again and commits head + 1), a fenced publisher re-reads the head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.exceptions import RayTaskError

from ledger import FencedError
from orchestrator.control.cells import is_actor_loss, is_engine_loss
from orchestrator.control.errors import EngineLostError, StepFailedError
from orchestrator.control.hooks import JobHooks
from orchestrator.control.policy import RetryableFailure

if TYPE_CHECKING:
    from orchestrator.control.supervisor import Supervisor

__all__ = ["PublishOutcome", "Publisher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishOutcome:
    """What one publish did: the committed version, who published it under which epoch, and
    which engines were stamped with it or failed."""

    version: int
    epoch: int
    publisher_cell: str
    stamped_engine_ids: list[str] = field(default_factory=list)
    failed_engine_ids: list[str] = field(default_factory=list)


class Publisher:
    """Publishes the publisher cell's weights to every engine, and saves checkpoints.

    Bound to its run through the supervisor (which holds the ledger, the cells, the engines
    and the manager); no URL or run id is threaded through calls.
    """

    def __init__(self, supervisor: Supervisor, hooks: JobHooks | None = None,
                 job: Any = None) -> None:
        self.supervisor = supervisor
        self.policy = supervisor.policy
        self._hooks = hooks or JobHooks()
        self._job = job

    def publish_weights(self) -> PublishOutcome:
        """Publish as the next version (ledger head + 1) to every engine; returns the outcome.

        Precondition: the cells are started and a publisher was promoted. Retries under the
        failure policy (see the module docstring). Afterwards the restarted engines serve and
        the rollout manager knows the version.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed.
            SupervisionLimitError: engines kept dying past the restart budget.
        """
        self._hooks.before_publish(self._job)
        try:
            for attempt in self.policy.attempts():
                with attempt:
                    outcome = self._attempt_sorted_out()
        except RetryableFailure as exc:
            raise StepFailedError(
                f"weight update failed {self.policy.max_attempts} times; last error: "
                f"{exc.cause}"
            ) from exc.cause
        self.supervisor.hand_over_engines()
        if self.supervisor.manager is not None:
            self.supervisor.call_manager(
                lambda manager: manager.set_weight_version.remote(outcome.version))
        return outcome

    def _attempt_sorted_out(self) -> PublishOutcome:
        try:
            return self.try_publish()
        except EngineLostError as exc:
            logger.warning("%s; restarting dead engines and publishing again", exc)
            self.supervisor.restart_dead_engines()
            raise RetryableFailure(exc) from exc
        except _PublisherLost as lost:
            self.supervisor.lose_cell(lost.cell_id, type(lost.cause).__name__)
            raise RetryableFailure(lost.cause) from lost.cause
        except FencedError as exc:
            self.supervisor.ensure_publisher(refresh=True)
            raise RetryableFailure(exc) from exc

    def try_publish(self) -> PublishOutcome:
        """ONE attempt of :meth:`publish_weights`, without retries or hand-over (tests and
        drills call it to observe a single attempt).

        Raises:
            EngineLostError: an engine died before the commit; nothing was committed, the
                other engines stay paused until the next update.
            FencedError: the publisher was superseded.
            Exception: the publisher cell raised (its error, unwrapped from Ray's).
        """
        cell_id, epoch = self.supervisor.ensure_publisher()
        engine_ids = list(self.supervisor.engines)
        engines = [self.supervisor.engines[engine_id] for engine_id in engine_ids]
        call = self.supervisor.cells.actor(cell_id).update_weights.remote(engines, epoch)
        results, failed = self.supervisor.cells.call_each({cell_id: call},
                                                          self.policy.step_timeout_s)
        if cell_id in failed:
            raise _classify(cell_id, failed[cell_id])
        report = results[cell_id]
        return PublishOutcome(
            version=report.version, epoch=epoch, publisher_cell=cell_id,
            stamped_engine_ids=list(report.stamped_engine_ids),
            failed_engine_ids=[engine_ids[index] for index in sorted(report.failed)],
        )

    def save_checkpoint(self, path: Path) -> dict[str, Any]:
        """The publisher writes its state to ``path`` and records ``checkpoint_saved``.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed.
        """
        try:
            for attempt in self.policy.attempts():
                with attempt:
                    return self._checkpoint_attempt(path)
        except RetryableFailure as exc:
            raise StepFailedError(f"checkpoint {path} could not be saved: {exc.cause}"
                                  ) from exc.cause
        raise AssertionError("unreachable")  # pragma: no cover

    def _checkpoint_attempt(self, path: Path) -> dict[str, Any]:
        cell_id, epoch = self.supervisor.ensure_publisher()
        call = self.supervisor.cells.actor(cell_id).save_checkpoint.remote(str(path), epoch)
        results, failed = self.supervisor.cells.call_each({cell_id: call},
                                                          self.policy.step_timeout_s)
        if cell_id not in failed:
            return results[cell_id]
        error = _classify(cell_id, failed[cell_id])
        if isinstance(error, _PublisherLost):
            self.supervisor.lose_cell(cell_id, type(error.cause).__name__)
            raise RetryableFailure(error.cause)
        if isinstance(error, FencedError):
            self.supervisor.ensure_publisher(refresh=True)
            raise RetryableFailure(error)
        raise error


class _PublisherLost(Exception):
    """The publisher cell is gone or frozen (its call raised a Ray actor error or timed out)."""

    def __init__(self, cell_id: str, cause: BaseException) -> None:
        super().__init__(f"publisher {cell_id} lost: {cause}")
        self.cell_id = cell_id
        self.cause = cause


def _classify(cell_id: str, exc: BaseException) -> BaseException:
    """The error a failed publisher call means: engine lost, publisher lost, or its own."""
    if is_engine_loss(exc):
        return EngineLostError(f"an engine died during the update: {exc}")
    if is_actor_loss(exc):
        return _PublisherLost(cell_id, exc)
    if isinstance(exc, RayTaskError):
        return exc.as_instanceof_cause()
    return exc
