"""RayEnginePool: the rollout engines (Ray actors) behind the control plane's EnginePool.

Requests go to the alive engine with the fewest requests in flight. An engine that dies mid
request (Ray ``ActorDiedError`` / ``ActorUnavailableError``) is marked dead and its in-flight
requests come back as ABORTED samples, so the data buffer recycles their prompts like any
aborted group; only when no engine is left does ``generate`` raise (the pool is broken).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from orchestrator.errors import NoEngineAliveError
from orchestrator.rollout.types import Prompt, Sample, SampleStatus

__all__ = ["NoEngineAliveError", "RayEnginePool"]

logger = logging.getLogger(__name__)

ENGINE_FAILURES = (ActorDiedError, ActorUnavailableError, RayActorError)



class RayEnginePool:
    """Least-loaded dispatch over named engine actor handles.

    Args:
        engines: engine id -> Ray actor handle of a ``RolloutEngine``.
    """

    def __init__(self, engines: dict[str, Any]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self._engines = dict(engines)
        self._in_flight = {engine_id: 0 for engine_id in engines}
        self._dead: set[str] = set()

    def alive_ids(self) -> list[str]:
        """Engines not known to be dead, in id order."""
        return sorted(set(self._engines) - self._dead)

    def replace(self, engine_id: str, handle: Any) -> None:
        """Put a (re)started engine under ``engine_id`` and consider it alive."""
        self._engines[engine_id] = handle
        self._in_flight.setdefault(engine_id, 0)
        self._dead.discard(engine_id)

    def mark_dead(self, engine_id: str) -> None:
        """Stop sending requests to ``engine_id``."""
        if engine_id not in self._dead:
            logger.warning("engine %s is dead; its in-flight requests come back aborted", engine_id)
        self._dead.add(engine_id)

    async def generate(self, prompt: Prompt, n_samples: int, group_index: int) -> list[Sample]:
        """Generate on the least-loaded alive engine (see :class:`EnginePool`).

        Raises:
            NoEngineAliveError: every engine is dead.
        """
        alive = self.alive_ids()
        if not alive:
            raise NoEngineAliveError("no rollout engine is alive")
        engine_id = min(alive, key=lambda e: (self._in_flight[e], e))
        self._in_flight[engine_id] += 1
        try:
            return await self._engines[engine_id].generate.remote(prompt, n_samples, group_index)
        except ENGINE_FAILURES:
            self.mark_dead(engine_id)
            return [
                Sample(
                    index=group_index * n_samples + i,
                    group_index=group_index,
                    prompt_tokens=list(prompt.tokens),
                    status=SampleStatus.ABORTED,
                    metadata={"aborted_by": f"death of engine {engine_id}"},
                )
                for i in range(n_samples)
            ]
        finally:
            self._in_flight[engine_id] -= 1
