"""Cell failover: a loss, a promotion, the quorum, a train step applied once, and healing.

There is ONE spelling of each:

- **a loss** (:meth:`CellFailover.lose`): the cells whose call failed as a lost actor does are
  marked errored, the others are heartbeated (a survivor's collective error only means a peer
  died), and a publisher is promoted if the old one is gone;
- **a promotion** (:meth:`CellFailover.promote`): through :meth:`ledger.Ledger.promote` with
  the node the cell runs on, epoch + 1, so the old publisher is fenced from that moment
  whether it is dead or only frozen;
- **a membership change** re-forms the gradient quorum (:meth:`CellFailover.reform`).

A train step that fails is sorted out and tried again under :meth:`FailurePolicy.run`; a step
some survivors had already applied is completed by copying their state, never applied twice.
Lost cells are healed at a step boundary with a survivor's state, charged to the restart budget.
When no cell survives (a publisher failed over to the only follower, which dies before the heal),
every cell is restarted from the run's newest checkpoint within the job, as a resume would
(:meth:`CellFailover.restore_from_checkpoint`), instead of ending the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from ledger import Ledger
from orchestrator.control.sharding import merge_cell_metrics
from orchestrator.control.supervision.cell_group import (
    CellGroup,
    CellState,
    CellStepAttempt,
    is_actor_loss,
)
from orchestrator.control.supervision.counters import SupervisionCounters
from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.errors import NoCellAliveError, RetryableFailure
from orchestrator.rollout.types import Sample

__all__ = ["CellFailover"]

logger = logging.getLogger(__name__)


class CellFailover:
    """Liveness, promotion, quorum, train-step retries and heals of the run's cells.

    Args:
        cells: the run's cells (mechanism: calls, bounded by ``policy``).
        ledger, run_id: where promotions are recorded.
        policy, budget: the attempts per operation and the restart budget (shared with the
            other supervision modules).
        counters: what supervision has done (promotions, retried steps, heals).
        node_of: the node a cell was placed on (recorded with each promotion).
    """

    def __init__(self, cells: CellGroup, ledger: Ledger, run_id: str, policy: FailurePolicy,
                 budget: RestartBudget, counters: SupervisionCounters,
                 node_of: Callable[[str], dict[str, str]]) -> None:
        self.cells = cells
        self.ledger = ledger
        self.run_id = run_id
        self.policy = policy
        self._budget = budget
        self._counters = counters
        self._node_of = node_of
        self._publisher: tuple[str, int] | None = None  # this process is the only promoter

    # ------------------------------------------------------------------ losses

    def check(self) -> list[str]:
        """Heartbeat every cell; after a loss fail over and re-form the quorum over the
        survivors (they are healed later, at a step boundary). Returns the lost cell ids."""
        lost = self.lose({})
        if lost:
            self.reform()
        return lost

    def lose(self, failed: Mapping[str, BaseException]) -> list[str]:
        """Sort out failed calls: mark the cells in ``failed`` that are gone or frozen, heartbeat
        the others, promote a publisher if the old one is lost. Returns the cells lost now.
        The caller re-forms the quorum (a quorum that fails to form calls this too).

        Raises:
            NoCellAliveError: no cell is left, and no checkpoint to restore them from.
        """
        before = set(self.cells.errored_ids())
        for cell_id, exc in failed.items():
            if is_actor_loss(exc):
                self.cells.mark_lost(cell_id, type(exc).__name__)
        self.cells.heartbeat()
        lost = [cell_id for cell_id in self.cells.errored_ids() if cell_id not in before]
        if not self.cells.alive_ids():
            self.restore_from_checkpoint()
        self.ensure_publisher()  # no ledger read while the cached publisher is alive
        return lost

    def restore_from_checkpoint(self) -> None:
        """Every cell is lost: start each again, load the run's newest checkpoint into all of
        them (``cell_state`` healed), promote one with a new epoch (fencing whatever is left of
        the old publisher) and re-form the quorum: what a resumed job does, within this one.
        The updates trained after the checkpoint are lost with the cells; the steps and prompts
        the ledger records stay trained, and the next update publishes the restored weights as
        head + 1.

        Raises:
            NoCellAliveError: the run has no checkpoint yet.
            SupervisionLimitError: the restart budget is spent.
        """
        checkpoint = self.ledger.progress(self.run_id).last_checkpoint
        if checkpoint is None:
            raise NoCellAliveError("every train cell is lost and the run has no checkpoint "
                                   "to restore them from")
        path = str(checkpoint["payload"]["path"])
        lost = self.cells.errored_ids()
        logger.warning("every train cell is lost; restarting %s from checkpoint %s", lost, path)
        for cell_id in lost:
            self._budget.charge(f"restoring cell {cell_id} from a checkpoint")
            self.cells.restart(cell_id)
        self.cells.load_checkpoint(path)
        for cell_id in lost:
            self.cells.record_state(cell_id, CellState.HEALED)
        self._counters.checkpoint_restores += 1
        self.promote(lost[0], "failover", self.ledger.head(self.run_id).publisher_cell)
        self.reform()

    # ------------------------------------------------------------------ promotions

    @property
    def publisher(self) -> tuple[str, int] | None:
        """The publisher cell and epoch this process promoted or read last (no ledger read)."""
        return self._publisher

    def ensure_publisher(self, reason: str = "failover", *, refresh: bool = False
                         ) -> tuple[str, int]:
        """The publisher and its epoch: an alive cell holding the newest epoch. Promotes the
        lowest alive cell when the publisher is lost (from then on the old one's writes raise
        ``FencedError``).

        The answer is kept between calls (this process is the only promoter of its run);
        ``refresh`` reads the ledger head again (after a ``FencedError``).

        Raises:
            NoCellAliveError: no cell is alive to publish.
        """
        alive = self.cells.alive_ids()
        if self._publisher is not None and not refresh and self._publisher[0] in alive:
            return self._publisher
        head = self.ledger.head(self.run_id)
        if head.publisher_cell in alive:
            self._publisher = (head.publisher_cell, head.epoch)
            return self._publisher
        if not alive:
            raise NoCellAliveError("no train cell is alive to publish")
        self.promote(alive[0], reason if head.epoch else "start", head.publisher_cell)
        assert self._publisher is not None
        return self._publisher

    def take_over(self, reason: str = "resume") -> int:
        """Promote the lowest alive cell even if the ledger's publisher looks alive: a new
        process (a resumed job) must not write under an epoch an older process may hold.
        Returns the new epoch.

        Raises:
            NoCellAliveError: no cell is alive.
        """
        alive = self.cells.alive_ids()
        if not alive:
            raise NoCellAliveError("no train cell is alive to publish")
        return self.promote(alive[0], reason, self.ledger.head(self.run_id).publisher_cell)

    def promote(self, cell_id: str, reason: str, previous_cell: str | None) -> int:
        """Make ``cell_id`` the publisher through the ledger (``cell_promoted`` with its node,
        epoch + 1); returns the new epoch. Not idempotent: each call fences the one before."""
        epoch = self.ledger.promote(self.run_id, cell_id, reason, previous_cell=previous_cell,
                                    node=self._node_of(cell_id))
        self._counters.promotions += 1
        level = logging.INFO if reason in ("start", "resume") else logging.WARNING
        logger.log(level, "cell %s promoted to publisher (%s), epoch %d", cell_id, reason, epoch)
        self._publisher = (cell_id, epoch)
        return epoch

    # ------------------------------------------------------------------ quorum and steps

    def reform(self) -> int:
        """Form a new quorum over the alive cells; returns its id. Cells that fail to join
        and are gone are marked lost and the quorum is formed again without them.

        Raises:
            NoCellAliveError: no cell is left.
            StepFailedError: ``max_attempts`` quorums failed.
        """
        def attempt() -> int:
            if not self.cells.alive_ids():
                raise NoCellAliveError("no train cell is alive")
            failed = self.cells.form_quorum()
            if failed:
                lost = self.lose(failed)
                raise RetryableFailure(next(iter(failed.values())), recovered=bool(lost))
            return self.cells.quorum_id

        return self.policy.run(
            attempt, f"quorum over {self.cells.alive_ids()} could not be formed")

    def train_step(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        """One GRPO step over ``groups``, sharded across the alive cells, applied exactly once.

        A cell lost mid-step is marked errored (and replaced as publisher if it was one), the
        quorum is re-formed over the survivors and the step is retried. If some survivors had
        already applied it, the rest adopt their state instead.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed; NoCellAliveError if none is left.
        """
        return self.policy.run(lambda: self._train_attempt(groups), "train step failed")

    def _train_attempt(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        alive = self.cells.alive_ids()
        if not alive:
            raise NoCellAliveError("no train cell is alive")
        # The step boundary's heartbeat (Supervisor.begin_step) already asked every cell its
        # count; only a retry, or a boundary that changed a cell since, asks again.
        seen = self.cells.take_heartbeat_progress(alive)
        before, failed = (seen, {}) if seen is not None else self.cells.progress(alive)
        attempt: CellStepAttempt | None = None
        if not failed:
            attempt = self.cells.train_once(groups)
            if not attempt.failed:
                return merge_cell_metrics([attempt.results[c] for c in alive], attempt.shards)
            failed = attempt.failed
        self._counters.retried_steps += 1
        error = next(iter(failed.values()))
        logger.warning("train step attempt failed: %s", error)
        lost = self.lose(failed)
        if attempt is not None and before and self._complete_half_applied_step(before):
            done = [c for c in self.cells.alive_ids() if c in attempt.results]
            self.reform()
            return merge_cell_metrics([attempt.results[c] for c in done],
                                      [attempt.shards[attempt.cells.index(c)] for c in done])
        self.reform()
        raise RetryableFailure(error, recovered=bool(lost))

    def _complete_half_applied_step(self, before: dict[str, int]) -> bool:
        """If any survivor applied the failed step, copy its state to the others; say so."""
        now, _ = self.cells.progress(self.cells.alive_ids())
        advanced = [c for c in now if now[c] > before.get(c, now[c])]
        if not advanced:
            return False
        laggards = [c for c in now if c not in advanced]
        self.cells.copy_state(advanced[0], laggards)
        logger.warning("step was applied by %s; %s adopted their state", advanced, laggards)
        return True

    # ------------------------------------------------------------------ heals

    def heal(self) -> list[str]:
        """Replace every lost cell with a new actor holding a survivor's weights and optimizer
        state (it rejoins as a follower), then re-form the quorum. Returns their ids.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            NoCellAliveError: no survivor, and no checkpoint to restore the cells from.
        """
        lost = self.cells.errored_ids()
        if lost and not self.cells.alive_ids():
            self.restore_from_checkpoint()
            return lost
        for cell_id in lost:
            survivors = self.cells.alive_ids()
            self._budget.charge(f"healing cell {cell_id}")
            self.cells.replace(cell_id, source=survivors[0])
            self._counters.heals += 1
        if lost:
            self.reform()
        return lost
