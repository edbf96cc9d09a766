"""The supervisor: liveness and replacement of every actor of a run, under ONE failure policy.

It owns the cells (:class:`~orchestrator.control.cells.CellGroup`), the rollout engines and the
rollout manager, and nothing else restarts or retries anything:

- **Liveness** comes from Ray errors (``ActorDiedError`` and friends on any call) and from
  heartbeats with a timeout; every wait is bounded by :class:`FailurePolicy`.
- **Failover**: when the publisher is lost, the lowest alive cell is promoted *through the
  ledger* (``cell_promoted``, epoch + 1), so the old publisher is fenced from that moment
  whether it is dead or only frozen. Membership changes re-form the gradient quorum.
- **Retries**: a train step or a quorum that fails is sorted out (lost cells marked, a
  publisher promoted) and tried again, at most ``max_attempts`` times; a step some survivors
  had already applied is completed by copying their state, never applied twice.
- **Replacement**: lost cells are healed with a survivor's state, dead engines restarted, a
  dead manager replaced with the prompt state the ledger records; every replacement is
  charged to one restart budget, and exhausting it ends the run (:class:`SupervisionLimitError`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from ledger import EventKind, Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.cells import CellFactory, CellGroup, is_actor_loss
from orchestrator.control.cluster.placement import Placement, start_on_a_live_node
from orchestrator.control.cluster.storage import CheckpointStore
from orchestrator.control.errors import NoCellAliveError, StepFailedError
from orchestrator.control.policy import FailurePolicy, RestartBudget, RetryableFailure
from orchestrator.control.provenance import write_manager_state_from_ledger
from orchestrator.control.sharding import merge_cell_metrics
from orchestrator.rollout.types import RolloutFnTrainOutput, Sample

__all__ = ["SupervisionCounters", "Supervisor"]

logger = logging.getLogger(__name__)

EngineFactory = Callable[[RunConfig, str], Any]
ManagerCall = Callable[[Any], Any]


@dataclass
class SupervisionCounters:
    """What the supervisor has seen and done (metrics, tests and drills read it)."""

    promotions: int = 0
    retried_steps: int = 0
    heals: int = 0
    engine_restarts: int = 0
    manager_replacements: int = 0


class Supervisor:
    """Liveness, failover, retries and replacement for one run.

    Args:
        config: the run's config (a started run: ``run_id`` and ``db`` set).
        ledger: an open writer ledger.
        layout: where the run's checkpoints and manager states live.
        policy: every limit (:meth:`FailurePolicy.from_config` by default).
        create_cell, create_engine: build one cell / engine actor (replacements are built
            exactly like the originals).
    """

    def __init__(self, config: RunConfig, ledger: Ledger, layout: RunLayout, *,
                 policy: FailurePolicy | None = None,
                 create_cell: CellFactory = launch.create_cell,
                 create_engine: EngineFactory = launch.create_engine) -> None:
        if config.run_id is None or config.db is None:
            raise ValueError("the supervisor needs a started run: config.run_id and config.db")
        self.config = config
        self.ledger = ledger
        self.run_id = config.run_id
        self.layout = layout
        self.policy = policy or FailurePolicy.from_config(config)
        self.placement = Placement(config, self.policy)  # first on bundles, then live nodes
        self.storage = CheckpointStore.of(config, layout)  # what every node reads
        self.cells = CellGroup(config, ledger, self.run_id, self.placement.placed(
            create_cell, "cell"), self.policy, node_of=self.placement.node_fields)
        self.engines: dict[str, Any] = {}
        self.manager: Any = None
        self.counters = SupervisionCounters()
        # Prompts of a drained batch the driver holds and has not recorded as trained yet.
        self.prompts_in_hand: set[int] = set()
        self._create_engine = self.placement.placed(create_engine, "engine")
        self._budget = RestartBudget(self.policy)
        self._engines_awaiting_weights: list[str] = []
        self._publisher: tuple[str, int] | None = None
        # Per-manager counters restart with a replacement manager; the run's total does not.
        self._negative_staleness_carried = 0
        self._negative_staleness_current = 0

    # ------------------------------------------------------------------ start

    def start_engines(self) -> None:
        """Create ``num_engines`` engines and wait until each answers."""
        self.engines = {
            f"engine-{i}": self._create_engine(self.config, f"engine-{i}")
            for i in range(self.config.num_engines)
        }
        ray.get([engine.health.remote() for engine in self.engines.values()])

    def start_cells(self) -> None:
        """Create the cells and form the first quorum."""
        self.cells.start()
        self.reform()

    def start_manager(self, state_path: str | None = None) -> None:
        """Create the rollout manager over the engines. A replacement (``state_path``: the
        state it restores) goes on a node that is alive now (:func:`start_on_a_live_node`)."""
        create = functools.partial(launch.create_rollout_manager, self.config, self.config.db,
                                   self.run_id, self.engines)
        if state_path is None:
            self.manager = create()
            return
        self.manager = start_on_a_live_node(create, launch.MANAGER_CPUS, self.policy)
        ray.get(self.manager.load.remote(state_path))

    # ------------------------------------------------------------------ cells

    def check_cells(self) -> list[str]:
        """Heartbeat every cell; after a loss promote a publisher if needed and re-form the
        quorum over the survivors (they are healed later, at a step boundary). Returns the
        lost cell ids."""
        lost = self.cells.heartbeat()
        if lost:
            self.ensure_publisher()
            self.reform()
        return lost

    def lose_cell(self, cell_id: str, why: str) -> None:
        """``cell_id`` failed a call as a lost actor does: mark it, check the others, fail
        over and re-form the quorum."""
        self.cells.mark_lost(cell_id, why)
        self.check_cells()
        self.ensure_publisher()
        self.reform()

    def ensure_publisher(self, reason: str = "failover", *, refresh: bool = False
                         ) -> tuple[str, int]:
        """The publisher and its epoch: an alive cell holding the newest epoch. Promotes the
        lowest alive cell through the ledger when the publisher is lost (from then on the old
        one's writes raise ``FencedError``).

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
        epoch = self.ledger.append(self.run_id, EventKind.CELL_PROMOTED, {  # promote + node
            "reason": reason if head.epoch else "start", "previous_cell": head.publisher_cell,
            **self.placement.node_fields(alive[0])}, cell_id=alive[0]).epoch
        self.counters.promotions += 1
        level = logging.INFO if reason == "start" else logging.WARNING
        logger.log(level, "cell %s promoted to publisher, epoch %d", alive[0], epoch)
        self._publisher = (alive[0], epoch)
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
        head = self.ledger.head(self.run_id)
        epoch = self.ledger.append(self.run_id, EventKind.CELL_PROMOTED, {  # promote + node
            "reason": reason, "previous_cell": head.publisher_cell,
            **self.placement.node_fields(alive[0])}, cell_id=alive[0]).epoch
        self.counters.promotions += 1
        self._publisher = (alive[0], epoch)
        return epoch

    def reform(self) -> int:
        """Form a new quorum over the alive cells; returns its id. Cells that fail to join
        and are gone are marked lost and the quorum is formed again without them.

        Raises:
            NoCellAliveError: no cell is left.
            StepFailedError: ``max_attempts`` quorums failed.
        """
        try:
            for attempt in self.policy.attempts():
                with attempt:
                    if not self.cells.alive_ids():
                        raise NoCellAliveError("no train cell is alive")
                    failed = self.cells.form_quorum()
                    if failed:
                        self._sort_out(failed)
                        raise RetryableFailure(next(iter(failed.values())))
        except RetryableFailure as exc:
            raise StepFailedError(
                f"quorum {self.cells.quorum_id} of {self.cells.alive_ids()} could not be "
                f"formed: {exc.cause}"
            ) from exc.cause
        return self.cells.quorum_id

    def train_step(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        """One GRPO step over ``groups``, sharded across the alive cells, applied exactly once.

        A cell lost mid-step is marked errored (and replaced as publisher if it was one), the
        quorum is re-formed over the survivors and the step is retried. If some survivors had
        already applied it, the rest adopt their state instead.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed; NoCellAliveError if none is left.
        """
        try:
            for attempt in self.policy.attempts():
                with attempt:
                    return self._train_attempt(groups)
        except RetryableFailure as exc:
            raise StepFailedError(
                f"train step failed {self.policy.max_attempts} times; last error: {exc.cause}"
            ) from exc.cause
        raise AssertionError("unreachable")  # pragma: no cover

    def _train_attempt(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        alive = self.cells.alive_ids()
        if not alive:
            raise NoCellAliveError("no train cell is alive")
        before, failed = self.cells.progress(alive)
        attempt = None
        if not failed:
            attempt = self.cells.train_once(groups)
            if not attempt.failed:
                return merge_cell_metrics([attempt.results[c] for c in alive], attempt.shards)
            failed = attempt.failed
        self.counters.retried_steps += 1
        error = next(iter(failed.values()))
        logger.warning("train step attempt failed: %s", error)
        self._sort_out(failed)
        if attempt is not None and before and self._complete_half_applied_step(before):
            done = [c for c in self.cells.alive_ids() if c in attempt.results]
            self.reform()
            return merge_cell_metrics([attempt.results[c] for c in done],
                                      [attempt.shards[attempt.cells.index(c)] for c in done])
        self.reform()
        raise RetryableFailure(error)

    def _sort_out(self, failed: dict[str, BaseException]) -> None:
        """Mark cells that are really gone; a survivor's collective error only means a peer
        died, which the heartbeat tells apart. Then make sure a publisher is alive."""
        for cell_id, exc in failed.items():
            if is_actor_loss(exc):
                self.cells.mark_lost(cell_id, type(exc).__name__)
        self.cells.heartbeat()
        self.ensure_publisher()

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

    def heal_lost_cells(self) -> list[str]:
        """Replace every lost cell with a new actor holding a survivor's weights and optimizer
        state (it rejoins as a follower), then re-form the quorum. Returns their ids.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            NoCellAliveError: no survivor to copy state from.
        """
        lost = self.cells.errored_ids()
        for cell_id in lost:
            survivors = self.cells.alive_ids()
            if not survivors:
                raise NoCellAliveError(f"no survivor to heal {cell_id} from")
            self._budget.charge(f"healing cell {cell_id}")
            self.cells.replace(cell_id, source=survivors[0])
            self.counters.heals += 1
        if lost:
            self.reform()
        return lost

    # ------------------------------------------------------------------ engines

    def probe_engines(self) -> dict[str, Any]:
        """Ask every engine for its health: the answers :meth:`restart_dead_engines` reads."""
        return {engine_id: engine.health.remote() for engine_id, engine in self.engines.items()}

    def restart_dead_engines(self, probe: dict[str, Any] | None = None) -> list[str]:
        """Replace engines Ray reports dead with new actors; returns their ids. A new engine
        starts with version-0 weights: it serves only after the next publish hands it over
        (:meth:`hand_over_engines`). ``probe``: answers of :meth:`probe_engines` (else asks now).

        Raises:
            SupervisionLimitError: the restart budget is spent.
        """
        refs = probe if probe is not None else self.probe_engines()
        dead = []
        for engine_id, ref in refs.items():
            try:
                ray.get(ref, timeout=self.policy.step_timeout_s + 30)
            except RayActorError:
                dead.append(engine_id)
        for engine_id in dead:
            self._budget.charge(f"restarting engine {engine_id}")
            logger.warning("engine %s is dead; starting a replacement", engine_id)
            with contextlib.suppress(Exception):  # already gone
                ray.kill(self.engines[engine_id], no_restart=True)
            self.engines[engine_id] = self._create_engine(self.config, engine_id)
        if dead:
            ray.get([self.engines[engine_id].health.remote() for engine_id in dead])
            self.counters.engine_restarts += len(dead)
            self._engines_awaiting_weights += dead
        return dead

    def hand_over_engines(self) -> list[str]:
        """Give the rollout manager the restarted engines, which now hold the newest version.
        Returns their ids."""
        ready, self._engines_awaiting_weights = self._engines_awaiting_weights, []
        for engine_id in ready:
            handle = self.engines[engine_id]
            self.call_manager(lambda manager, e=engine_id, h=handle: manager.replace_engine
                              .remote(e, h))
        return ready

    # ------------------------------------------------------------------ rollout manager

    def call_manager(self, call: ManagerCall, timeout: float | None = None) -> Any:
        """``call(manager)`` returns an object ref; wait for it. If the manager is dead, replace
        it and make the call once more on the new one.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            RayTaskError: the manager raised (not a death).
        """
        timeout = timeout or self.policy.manager_call_timeout_s
        try:
            return ray.get(call(self.manager), timeout=timeout)
        except RayActorError as exc:
            if isinstance(exc, RayTaskError):
                raise
            logger.warning("rollout manager lost (%s); replacing it", type(exc).__name__)
            self.replace_manager()
            return ray.get(call(self.manager), timeout=timeout)

    def manager_alive(self) -> bool:
        """Whether the current manager answers within the manager call timeout."""
        try:
            ray.get(self.manager.get_weight_version.remote(),
                    timeout=self.policy.manager_call_timeout_s)
        except RayActorError:
            return False
        return True

    def replace_manager(self) -> None:
        """Start a new rollout manager over the current engines with the prompt state the
        ledger records (``batch_trained`` events): the stream continues where the ledger says,
        issued prompts neither trained nor dropped are regenerated, except those of the batch
        in the driver's hand (:attr:`prompts_in_hand`). Its version comes from the ledger head.

        Raises:
            SupervisionLimitError: the restart budget is spent.
        """
        self._budget.charge("replacing the rollout manager")
        self._negative_staleness_carried += self._negative_staleness_current
        self._negative_staleness_current = 0
        with contextlib.suppress(Exception):  # it is gone already
            ray.kill(self.manager, no_restart=True)
        path = self.storage.manager_state_from_ledger_path
        write_manager_state_from_ledger(self.ledger, self.run_id, path,
                                        held=self.prompts_in_hand)
        self.start_manager(str(path))
        self.counters.manager_replacements += 1

    def note_negative_staleness(self, count: int) -> None:
        """The current manager's negative staleness count (a replacement restarts at 0)."""
        self._negative_staleness_current = count

    @property
    def negative_staleness_total(self) -> int:
        """Negative staleness values counted in this run, across rollout-manager replacements
        (DESIGN invariant 6: must stay 0)."""
        return self._negative_staleness_carried + self._negative_staleness_current

    def await_drain(self, request: Callable[[], Any], pending: Any) -> RolloutFnTrainOutput:
        """Wait for a drain while watching the processes it depends on.

        Every ``heartbeat_timeout_s`` without a batch the cells are heartbeated (a lost cell is
        failed over now, healed at the step boundary). A dead rollout manager is replaced from
        the ledger's prompt state and ``request()`` is sent again to the new one.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            RayTaskError: the manager raised (a bug, not a death).
        """
        while True:
            ready, _ = ray.wait([pending], timeout=self.policy.heartbeat_timeout_s)
            if not ready:
                self.check_cells()
                continue
            try:
                return ray.get(pending)
            except RayActorError as exc:
                if isinstance(exc, RayTaskError):
                    raise
                if not self.manager_alive():  # else it was replaced since this request
                    logger.warning("rollout manager lost (%s); replacing it",
                                   type(exc).__name__)
                    self.replace_manager()
                pending = request()

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Stop the producer, the cells and the engines (best effort)."""
        if self.manager is not None:
            try:
                ray.get(self.manager.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001
                logger.debug("rollout manager shutdown failed", exc_info=True)
            ray.kill(self.manager, no_restart=True)
        self.cells.stop()
        for engine in self.engines.values():
            try:
                ray.kill(engine, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.placement.release()
