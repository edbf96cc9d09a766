"""Manager watch: the rollout manager's liveness and replacement, and the drains it serves.

Every call on the manager is bounded (``manager_call_timeout_s``), and a drain that waits
longer than that probes the manager with a shorter bounded call (``manager_probe_timeout_s``).
A manager that dies, or is frozen (no answer within the bound), is replaced by a new one on a
node alive now, which rebuilds its prompt state from the ledger itself
(:meth:`RolloutManager.restore_from_ledger`): the stream continues where the ledger's
``batch_trained`` events say, and the prompts of the batch the driver holds (drained, not yet
recorded as trained) are not regenerated. The replacement is charged to the restart budget.

A drain is a :class:`Drain`: the manager asked and its answer. A drain asked of a manager that
has been replaced since is asked again of the new one, which regenerates those prompts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.placement.placer import start_on_a_live_node
from orchestrator.control.supervision.counters import SupervisionCounters
from orchestrator.control.supervision.engine_restarts import ReplacementRecorder
from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.rollout.types import RolloutFnTrainOutput

__all__ = ["Drain", "ManagerCall", "ManagerFactory", "ManagerWatch"]

logger = logging.getLogger(__name__)

ManagerCall = Callable[[Any], Any]
# (config, ledger_url, run_id, engines, scheduling_strategy) -> a RolloutManager actor handle
ManagerFactory = Callable[..., Any]


@dataclass(frozen=True)
class Drain:
    """A drain requested: the manager asked, the step, and its pending answer."""

    manager: Any
    step: int
    pending: Any


class ManagerWatch:
    """The run's rollout manager: started, called with bounds, replaced when it dies.

    Args:
        config: a started run's config (``run_id`` and ``db`` set).
        engines: the engine ids and handles the manager serves from (read at each start).
        policy, budget, counters: shared with the other supervision modules.
        on_idle: called every ``heartbeat_timeout_s`` a drain waits (the cells' heartbeat).
        create_manager: builds the manager actor (:func:`launch.create_rollout_manager`).
        on_replaced: told of each replacement once the new manager has restored
            (``"rollout-manager"``, its id, ``"dead"`` or ``"frozen"``).
    """

    def __init__(self, config: RunConfig, engines: Callable[[], dict[str, Any]],
                 policy: FailurePolicy, budget: RestartBudget, counters: SupervisionCounters,
                 on_idle: Callable[[], object],
                 create_manager: ManagerFactory = launch.create_rollout_manager,
                 on_replaced: ReplacementRecorder | None = None) -> None:
        self.config = config
        self._on_replaced = on_replaced or (lambda actor, actor_id, reason: None)
        self.manager: Any = None
        self.policy = policy
        self._engines = engines
        self._budget = budget
        self._counters = counters
        self._on_idle = on_idle
        self._create_manager = create_manager
        # Prompts of a drained batch the driver holds and has not recorded as trained yet.
        self.prompts_in_hand: frozenset[int] = frozenset()
        # Per-manager counters restart with a replacement manager; the run's total does not.
        self._negative_staleness_carried = 0
        self._negative_staleness_current = 0
        self._pending_push: tuple[Any, Any] | None = None  # (manager, its answer's ref)

    def start(self, *, restore: bool = False) -> None:
        """Create the rollout manager over the engines; ``restore``: it continues the prompt
        stream the ledger records (a resume), with :attr:`prompts_in_hand` held back.

        Raises:
            GetTimeoutError: the new manager did not restore within the manager call timeout.
        """
        create = functools.partial(self._create_manager, self.config, self.config.db,
                                   self.config.run_id, self._engines())
        if not restore:
            self.manager = create()
            return
        if self.manager is None:
            self.manager = create()
        else:  # a replacement: on a node that is alive now
            self.manager = start_on_a_live_node(create, launch.MANAGER_CPUS, self.policy)
        ray.get(self.manager.restore_from_ledger.remote(sorted(self.prompts_in_hand)),
                timeout=self.policy.manager_call_timeout_s)

    def call(self, call: ManagerCall, timeout: float | None = None) -> Any:
        """``call(manager)`` returns an object ref; wait for it. If the manager is dead, or
        frozen (no answer within the timeout), replace it and make the call once more on the
        new one.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            RayTaskError: the manager raised (not a death).
            GetTimeoutError: the replacement did not answer within the timeout either.
        """
        timeout = timeout or self.policy.manager_call_timeout_s
        try:
            return ray.get(call(self.manager), timeout=timeout)
        except (RayActorError, GetTimeoutError) as exc:
            if isinstance(exc, RayTaskError):
                raise
            logger.warning("rollout manager lost (%s); replacing it", type(exc).__name__)
            self.replace("frozen" if isinstance(exc, GetTimeoutError) else "dead")
            return ray.get(call(self.manager), timeout=timeout)

    def alive(self, timeout: float | None = None) -> bool:
        """Whether the current manager answers within ``timeout`` (default: the manager call
        timeout; a frozen one does not)."""
        try:
            ray.get(self.manager.get_weight_version.remote(),
                    timeout=self.policy.manager_call_timeout_s if timeout is None else timeout)
        except (RayActorError, GetTimeoutError):
            return False
        return True

    def replace(self, reason: str = "dead") -> None:
        """Start a new rollout manager over the current engines, which rebuilds its prompt
        state from the ledger (except :attr:`prompts_in_hand`); its version is the ledger head.
        ``reason`` (``"dead"`` or ``"frozen"``) is what ``on_replaced`` is told.

        Raises:
            SupervisionLimitError: the restart budget is spent.
        """
        self._budget.charge("replacing the rollout manager")
        self._negative_staleness_carried += self._negative_staleness_current
        self._negative_staleness_current = 0
        with contextlib.suppress(Exception):  # it is gone already
            ray.kill(self.manager, no_restart=True)
        self.start(restore=True)
        self._counters.manager_replacements += 1
        self._on_replaced("rollout-manager", "rollout-manager", reason)

    def hold(self, prompts: Iterable[int]) -> None:
        """The driver holds these prompts (drained, not yet recorded as trained); empty after
        the step's ``batch_trained`` is recorded."""
        self.prompts_in_hand = frozenset(prompts)

    def note_negative_staleness(self, count: int) -> None:
        """The current manager's negative staleness count (a replacement restarts at 0)."""
        self._negative_staleness_current = count

    @property
    def negative_staleness_total(self) -> int:
        """Negative staleness values counted in this run, across rollout-manager replacements
        (DESIGN invariant 6: must stay 0)."""
        return self._negative_staleness_carried + self._negative_staleness_current

    def push_version(self, version: int) -> None:
        """Tell the manager ``version`` was committed, without waiting for its answer: the
        weight update does not wait on a manager whose event loop is busy generating.
        :meth:`settle_push` checks the answer at the step boundary (an earlier unsettled push
        is settled first). The manager loses nothing meanwhile: it reads the ledger head at
        the start of every drain, so its version never lags the ledger across a drain.
        """
        self.settle_push()
        self._pending_push = (self.manager, self.manager.set_weight_version.remote(version))

    def settle_push(self, *, wait: bool = True) -> None:
        """Check the last :meth:`push_version`'s answer, waiting for it (bounded) unless
        ``wait`` is False: then an answer not in yet stays pending, for the next push (or the
        next waiting call) to check. A manager that died or froze meanwhile is replaced (the
        new one starts at the ledger head, so the push is not made again); a push to a
        manager replaced since is moot.

        Raises:
            RayTaskError: the manager refused the version (a regression, or ahead of the
                ledger).
            SupervisionLimitError: the restart budget is spent.
        """
        pending, self._pending_push = self._pending_push, None
        if pending is None or pending[0] is not self.manager:
            return
        if not wait and not ray.wait([pending[1]], timeout=0)[0]:
            self._pending_push = pending
            return
        try:
            ray.get(pending[1], timeout=self.policy.manager_call_timeout_s)
        except (RayActorError, GetTimeoutError) as exc:
            if isinstance(exc, RayTaskError):
                raise
            logger.warning("rollout manager lost (%s) after a version push; replacing it",
                           type(exc).__name__)
            self.replace("frozen" if isinstance(exc, GetTimeoutError) else "dead")

    def request_drain(self, step: int) -> Drain:
        """Ask the current manager for the batch of ``step``; :meth:`await_drain` waits."""
        return Drain(self.manager, step, self.manager.generate.remote(step))

    def await_drain(self, drain: Drain) -> RolloutFnTrainOutput:
        """Wait for ``drain`` while watching the processes it depends on.

        A drain asked of a manager replaced since is asked again of the current one. Every
        ``heartbeat_timeout_s`` without a batch ``on_idle`` runs (a lost cell is failed over
        now, healed at the step boundary). A dead rollout manager is replaced from the
        ledger's prompt state and the drain is asked again of the new one. So is a frozen
        one: after each ``manager_call_timeout_s`` without a batch the manager is probed
        (:meth:`alive`, bounded by ``manager_probe_timeout_s``), so a stopped manager costs at
        most a call timeout, a heartbeat and a probe, while a drain that is only slow (held
        back by admission, engines replaced) waits on.

        Raises:
            SupervisionLimitError: the restart budget is spent.
            RayTaskError: the manager raised (a bug, not a death).
        """
        if drain.manager is not self.manager:
            drain = self.request_drain(drain.step)
        silent_since = time.monotonic()
        while True:
            ready, _ = ray.wait([drain.pending], timeout=self.policy.heartbeat_timeout_s)
            if not ready:
                self._on_idle()
                if time.monotonic() - silent_since >= self.policy.manager_call_timeout_s:
                    if not self.alive(self.policy.manager_probe_timeout_s):
                        logger.warning("rollout manager frozen (no batch in %.0f s, no answer "
                                       "to a probe in %.0f s); replacing it",
                                       self.policy.manager_call_timeout_s,
                                       self.policy.manager_probe_timeout_s)
                        self.replace("frozen")
                        drain = self.request_drain(drain.step)
                    silent_since = time.monotonic()
                continue
            try:
                return ray.get(drain.pending)
            except RayActorError as exc:
                if isinstance(exc, RayTaskError):
                    raise
                if not self.alive():  # else it was replaced since this request
                    logger.warning("rollout manager lost (%s); replacing it",
                                   type(exc).__name__)
                    self.replace()
                drain = self.request_drain(drain.step)

    def stop(self) -> None:
        """Shut the manager down (best effort)."""
        if self.manager is None:
            return
        try:
            ray.get(self.manager.shutdown.remote(), timeout=30)
        except Exception:  # noqa: BLE001
            logger.debug("rollout manager shutdown failed", exc_info=True)
        with contextlib.suppress(Exception):
            ray.kill(self.manager, no_restart=True)
