"""The supervisor: the one facade the training loop asks, torchft-style, at a step boundary.

It owns every actor of a run and their liveness, under ONE :class:`FailurePolicy` and one
restart budget; nothing else retries or restarts anything. The loop calls it twice per step:

- :meth:`Supervisor.begin_step` (a batch is drained): the driver now holds its prompts (a
  replaced rollout manager will not regenerate them), the cells are heartbeated (a loss is
  failed over now) and the engines are probed (answered while the cells train);
- :meth:`Supervisor.end_step` (the step is recorded): the prompts are on record, the
  manager's answer to the version push is checked if it is in (else by the next push), and
  lost cells are healed (new actors take seconds: after the step's commit, not before it).

In between, :meth:`Supervisor.train_step` trains once under the policy and reads the engine
probe: engines dead or frozen are replaced, and :attr:`Supervisor.engines_awaiting_weights`
tells the loop the next update must reach them. The jobs live in one module each:
:mod:`.cell_failover` (losses, promotions, quorum, heals), :mod:`.engine_restarts` and
:mod:`.manager_watch`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ledger import EventKind, Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.placement.placer import Placement
from orchestrator.control.placement.storage import CheckpointStore
from orchestrator.control.supervision.cell_failover import CellFailover
from orchestrator.control.supervision.cell_group import CellFactory, CellGroup
from orchestrator.control.supervision.counters import SupervisionCounters
from orchestrator.control.supervision.engine_restarts import EngineFactory, EngineRestarts
from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.control.supervision.manager_watch import (
    Drain,
    ManagerCall,
    ManagerFactory,
    ManagerWatch,
)
from orchestrator.rollout.types import RolloutFnTrainOutput, Sample

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)


class Supervisor:
    """Liveness, failover, retries and replacement for one run.

    Args:
        config: the run's config (a started run: ``run_id`` and ``db`` set).
        ledger: an open writer ledger.
        layout: where the run's checkpoints live.
        policy: every limit (:meth:`FailurePolicy.from_config` by default).
        create_cell, create_engine, create_manager: build one cell / engine / rollout manager
            actor (replacements are built exactly like the originals).
    """

    def __init__(self, config: RunConfig, ledger: Ledger, layout: RunLayout, *,
                 policy: FailurePolicy | None = None,
                 create_cell: CellFactory = launch.create_cell,
                 create_engine: EngineFactory = launch.create_engine,
                 create_manager: ManagerFactory = launch.create_rollout_manager) -> None:
        if config.run_id is None or config.db is None:
            raise ValueError("the supervisor needs a started run: config.run_id and config.db")
        self.config = config
        self.run_id = config.run_id
        self.policy = policy or FailurePolicy.from_config(config)
        self.placement = Placement(config, self.policy)  # first on bundles, then live nodes
        self.storage = CheckpointStore.of(config, layout)  # what every node reads
        self.counters = SupervisionCounters()
        budget = RestartBudget(self.policy)
        self.cells = CellGroup(config, ledger, self.run_id, self.placement.placed(
            create_cell, "cell"), self.policy, node_of=self.placement.node_fields)
        self.failover = CellFailover(self.cells, ledger, self.run_id, self.policy, budget,
                                     self.counters, self.placement.node_fields)
        self._ledger = ledger
        self.engine_restarts = EngineRestarts(
            config, self.placement.placed(create_engine, "engine"), self.policy, budget,
            self.counters, on_replaced=self.record_replacement)
        self.manager_watch = ManagerWatch(config, lambda: self.engines, self.policy, budget,
                                          self.counters, on_idle=self.failover.check,
                                          create_manager=create_manager,
                                          on_replaced=self.record_replacement)
        self._engine_probe: dict[str, Any] | None = None

    def record_replacement(self, actor: str, actor_id: str, reason: str) -> None:
        """Append ``actor_replaced``: an engine or the rollout manager was replaced, and why
        (the audit trail of supervision; a healed cell is ``cell_state`` healed)."""
        self._ledger.append(self.run_id, EventKind.ACTOR_REPLACED,
                            {"actor": actor, "actor_id": actor_id, "reason": reason})

    # ------------------------------------------------------------------ the actors

    @property
    def engines(self) -> dict[str, Any]:
        """Engine id -> its current actor handle."""
        return self.engine_restarts.engines

    @engines.setter
    def engines(self, engines: dict[str, Any]) -> None:  # tests bring their own engines
        self.engine_restarts.engines = engines

    @property
    def manager(self) -> Any:
        """The current rollout manager's actor handle."""
        return self.manager_watch.manager

    def start_engines(self) -> None:
        """Create ``num_engines`` engines and wait (bounded) until each answers."""
        self.engine_restarts.start()

    def start_cells(self) -> None:
        """Create the cells and form the first quorum."""
        self.cells.start()
        self.failover.reform()

    def start_engines_and_cells(self, *, with_manager: bool = False) -> None:
        """Create the engines and the cells (and, ``with_manager``, the rollout manager of a
        new run) at once, then wait for the engines and the cells and form the first quorum:
        every actor's process boots while the others load (start-up is the slowest of them,
        not their sum). A new run's manager only opens the ledger until its first drain; a
        resumed run's is started later (:meth:`start_manager`), after the checkpoint.

        Raises:
            StartupError: an engine did not answer within ``first_start_timeout_s``.
            GetTimeoutError: a cell did not (or a cell's first failure, as it was raised).
        """
        self.engine_restarts.create()
        self.cells.create()
        if with_manager:
            self.manager_watch.start()
        self.engine_restarts.wait_started()
        self.cells.wait_started()
        self.failover.reform()

    def start_manager(self, *, restore: bool = False) -> None:
        """Create the rollout manager, unless :meth:`start_engines_and_cells` did; ``restore``:
        it continues the ledger's prompt stream."""
        if self.manager_watch.manager is None or restore:
            self.manager_watch.start(restore=restore)

    # ------------------------------------------------------------------ the step boundary

    def send_heartbeat(self) -> None:
        """Ask the cells for the heartbeat :meth:`begin_step` reads, now (the loop does so
        before it waits for a batch, so the round trip passes while the batch arrives)."""
        self.cells.send_heartbeat()

    def begin_step(self, batch: RolloutFnTrainOutput) -> None:
        """A batch is drained and about to train: hold its prompts, heartbeat the cells (fail
        over after a loss) and send the engine probe :meth:`train_step` reads."""
        self.manager_watch.hold(group[0].group_index for group in batch.samples if group)
        self.failover.check()
        self._engine_probe = self.engine_restarts.probe()

    def train_step(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        """One GRPO step over ``groups``, applied exactly once (see :mod:`.cell_failover`),
        then the engine probe is read: dead or frozen engines are replaced.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed; NoCellAliveError if none is left.
            SupervisionLimitError: the restart budget is spent.
        """
        metrics = self.failover.train_step(groups)
        probe, self._engine_probe = self._engine_probe, None
        self.engine_restarts.restart_dead(probe)
        return metrics

    @property
    def engines_awaiting_weights(self) -> bool:
        """True if a restarted engine waits for the next weight update (publish now)."""
        return bool(self.engine_restarts.awaiting_weights)

    def end_step(self) -> list[str]:
        """The step is recorded (its prompts are trained on record): let go of them, check
        the rollout manager's answer to the step's version push if it is in (else the next
        push, or :meth:`settle_version_push`, waits for it: the step does not wait on a
        manager busy generating), and heal lost cells. Returns the healed cell ids.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            NoCellAliveError: no survivor to copy state from.
            RayTaskError: the manager refused the pushed version.
        """
        self.manager_watch.hold(())
        self.manager_watch.settle_push(wait=False)
        return self.failover.heal()

    def settle_version_push(self) -> None:
        """Wait (bounded) for the manager's answer to the last version push, replacing a
        manager that died or froze meanwhile (the end of training calls it).

        Raises:
            RayTaskError: the manager refused the pushed version.
            SupervisionLimitError: the restart budget is spent.
        """
        self.manager_watch.settle_push()

    # ------------------------------------------------------------------ asked by others

    def ensure_publisher(self, reason: str = "failover", *, refresh: bool = False
                         ) -> tuple[str, int]:
        """The publisher and its epoch (:meth:`CellFailover.ensure_publisher`)."""
        return self.failover.ensure_publisher(reason, refresh=refresh)

    def take_over(self, reason: str = "resume") -> int:
        """A new epoch for this process (:meth:`CellFailover.take_over`)."""
        return self.failover.take_over(reason)

    def check_cells(self) -> list[str]:
        """Heartbeat the cells now (:meth:`CellFailover.check`); returns the lost ids."""
        return self.failover.check()

    def heal_lost_cells(self) -> list[str]:
        """Heal lost cells now (:meth:`CellFailover.heal`); returns their ids."""
        return self.failover.heal()

    def call_manager(self, call: ManagerCall, timeout: float | None = None) -> Any:
        """A bounded call on the rollout manager, replacing it once if it died."""
        return self.manager_watch.call(call, timeout)

    def request_drain(self, step: int) -> Drain:
        """Ask the rollout manager for the batch of ``step`` (the loop prefetches with it)."""
        return self.manager_watch.request_drain(step)

    def await_drain(self, drain: Drain) -> RolloutFnTrainOutput:
        """Wait for ``drain``, heartbeating the cells, replacing a dead manager."""
        return self.manager_watch.await_drain(drain)

    def note_negative_staleness(self, count: int) -> None:
        """The current manager's negative staleness count (a replacement restarts at 0)."""
        self.manager_watch.note_negative_staleness(count)

    @property
    def negative_staleness_total(self) -> int:
        """Negative staleness in this run across manager replacements (must stay 0)."""
        return self.manager_watch.negative_staleness_total

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Stop the producer, the cells and the engines (best effort)."""
        self.manager_watch.stop()
        self.cells.stop()
        self.engine_restarts.stop()
        self.placement.release()
