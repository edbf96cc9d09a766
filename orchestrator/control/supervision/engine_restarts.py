"""Engine restarts: a dead or frozen rollout engine is replaced, and handed over once it holds
the newest weights.

An engine is probed before a train step (:meth:`EngineRestarts.probe`) and its answer read
after it (:meth:`EngineRestarts.restart_dead`), so the probe costs the step nothing. An engine
that raised a Ray actor error, or gave no answer within the policy's probe timeout (frozen,
SIGSTOPped, its node gone), counts as dead: it is killed and a new actor is started with the
same id, charged to the restart budget. A new engine starts with version-0 weights; it serves
only after the next weight update reaches it (:meth:`EngineRestarts.hand_over`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from orchestrator.config import RunConfig
from orchestrator.control.supervision.counters import SupervisionCounters
from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.errors import StartupError, SupervisionLimitError

__all__ = ["EngineFactory", "EngineRestarts", "ReplacementRecorder"]

logger = logging.getLogger(__name__)

EngineFactory = Callable[[RunConfig, str], Any]
# (actor, actor_id, reason): the supervisor records a replacement (``actor_replaced``)
ReplacementRecorder = Callable[[str, str, str], None]


class EngineRestarts:
    """The run's rollout engines, their liveness and their replacement.

    Args:
        config: the run's config (``num_engines``).
        create_engine: builds one engine actor (placed; replacements exactly like originals).
        policy, budget, counters: shared with the other supervision modules.
        on_replaced: told of each replacement as it starts (``"engine"``, id, ``"dead"`` or
            ``"frozen"``).
    """

    def __init__(self, config: RunConfig, create_engine: EngineFactory, policy: FailurePolicy,
                 budget: RestartBudget, counters: SupervisionCounters,
                 on_replaced: ReplacementRecorder | None = None) -> None:
        self.config = config
        self.engines: dict[str, Any] = {}
        self.policy = policy
        self._create_engine = create_engine
        self._on_replaced = on_replaced or (lambda actor, actor_id, reason: None)
        self._budget = budget
        self._counters = counters
        self._awaiting_weights: list[str] = []

    def start(self) -> None:
        """Create ``num_engines`` engines and wait until each answers.

        Raises:
            StartupError: an engine did not answer within ``first_start_timeout_s``.
        """
        self.create()
        self.wait_started()

    def create(self) -> None:
        """Create ``num_engines`` engines without waiting for them (they start meanwhile)."""
        self.engines = {f"engine-{i}": self._create_engine(self.config, f"engine-{i}")
                        for i in range(self.config.num_engines)}

    def wait_started(self) -> None:
        """Wait until each engine :meth:`create` made answers.

        Raises:
            StartupError: an engine did not answer within ``first_start_timeout_s``.
        """
        silent = self._silent_after_start(list(self.engines), self.policy.first_start_timeout_s)
        if silent:
            raise StartupError(f"engines {silent} did not start within "
                               f"{self.policy.first_start_timeout_s:g}s")

    @property
    def awaiting_weights(self) -> list[str]:
        """Engines restarted since the last hand-over: the next step must publish to them."""
        return list(self._awaiting_weights)

    def probe(self) -> dict[str, Any]:
        """Ask every engine for its health now; :meth:`restart_dead` reads the answers."""
        return {engine_id: engine.health.remote() for engine_id, engine in self.engines.items()}

    def restart_dead(self, probe: dict[str, Any] | None = None) -> list[str]:
        """Replace every engine that died or stayed silent past the probe timeout; returns
        their ids. ``probe``: answers of :meth:`probe` (else asks now).

        Raises:
            SupervisionLimitError: the restart budget is spent, or a replacement did not start.
            RayTaskError: an engine's health check raised (a bug, not a death).
        """
        refs = probe if probe is not None else self.probe()
        lost = self._dead_in(refs)
        dead = list(lost)
        for engine_id, reason in lost.items():
            self._budget.charge(f"restarting engine {engine_id}")
            logger.warning("engine %s is %s; starting a replacement", engine_id, reason)
            with contextlib.suppress(Exception):  # already gone; a frozen one must die now
                ray.kill(self.engines[engine_id], no_restart=True)
            self.engines[engine_id] = self._create_engine(self.config, engine_id)
            self._on_replaced("engine", engine_id, reason)
        if dead:
            silent = self._silent_after_start(dead, self.policy.actor_start_timeout_s)
            if silent:
                raise SupervisionLimitError(f"replacement engines {silent} did not start "
                                            f"within {self.policy.actor_start_timeout_s:g}s")
            self._counters.engine_restarts += len(dead)
            self._awaiting_weights += dead
        return dead

    def hand_over(self, give: Callable[[str, Any], None]) -> list[str]:
        """``give(engine_id, handle)`` for every restarted engine (they now hold the newest
        version: call after a weight update reached them). Returns their ids."""
        ready, self._awaiting_weights = self._awaiting_weights, []
        for engine_id in ready:
            give(engine_id, self.engines[engine_id])
        return ready

    def stop(self) -> None:
        """Kill every engine (best effort)."""
        for engine in self.engines.values():
            with contextlib.suppress(Exception):
                ray.kill(engine, no_restart=True)

    def _dead_in(self, refs: dict[str, Any]) -> dict[str, str]:
        """The engines of ``refs`` that are lost: id -> ``"dead"`` or ``"frozen"``."""
        if not refs:
            return {}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                            timeout=self.policy.probe_timeout_s)
        dead = {}
        for engine_id, ref in refs.items():
            if ref not in ready:  # frozen: a timeout counts as a death
                dead[engine_id] = "frozen"
                continue
            try:
                ray.get(ref)
            except RayActorError as exc:
                if isinstance(exc, RayTaskError):
                    raise
                dead[engine_id] = "dead"
        return dead

    def _silent_after_start(self, engine_ids: list[str], timeout: float) -> list[str]:
        """The engines of ``engine_ids`` whose health gave no answer within ``timeout``
        (an engine that died starting raises its Ray error)."""
        refs = [self.engines[engine_id].health.remote() for engine_id in engine_ids]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        ray.get(ready)
        return [e for e, ref in zip(engine_ids, refs) if ref not in ready]
