"""RayEnginePool: the rollout engines (Ray actors) behind the control plane's EnginePool.

Requests go to the alive engine with the fewest requests in flight. The groups the producer
starts together (in one turn of the event loop) that go to the same engine are sent as one
``generate_batch`` call of at most ``max_groups_per_call`` groups, and come back as one answer:
a step's traffic is a few Ray round trips per engine instead of one per group. With
``max_groups_per_call=1`` every group is its own ``generate`` call.

An engine that dies mid request (Ray ``ActorDiedError`` / ``ActorUnavailableError``) is marked
dead and its in-flight requests (every group of the call) come back as ABORTED samples, so the
data buffer recycles their prompts like any aborted group; only when no engine is left does
``generate`` raise (the pool is broken).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from orchestrator.errors import NoEngineAliveError
from orchestrator.rollout.types import GroupRequest, Prompt, Sample, SampleStatus

__all__ = ["DEFAULT_MAX_GROUPS_PER_CALL", "NoEngineAliveError", "RayEnginePool"]

logger = logging.getLogger(__name__)

ENGINE_FAILURES = (ActorDiedError, ActorUnavailableError, RayActorError)
DEFAULT_MAX_GROUPS_PER_CALL = 8


@dataclass
class _Waiting:
    """A group queued for an engine's next batched call, and where its samples go."""

    request: GroupRequest
    samples: asyncio.Future[list[Sample]]


class RayEnginePool:
    """Least-loaded dispatch over named engine actor handles, groups batched per engine.

    Args:
        engines: engine id -> Ray actor handle of a ``RolloutEngine``.
        max_groups_per_call: groups in one engine call at most (``RunConfig``'s
            ``engine_call_max_groups``); 1 sends one ``generate`` call per group.
    """

    def __init__(self, engines: dict[str, Any],
                 max_groups_per_call: int = DEFAULT_MAX_GROUPS_PER_CALL) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        if max_groups_per_call < 1:
            raise ValueError(f"max_groups_per_call must be >= 1, got {max_groups_per_call}")
        self._engines = dict(engines)
        self._in_flight = {engine_id: 0 for engine_id in engines}
        self._dead: set[str] = set()
        self.max_groups_per_call = max_groups_per_call
        self._queued: dict[str, list[_Waiting]] = {}
        self._calls: set[asyncio.Task[None]] = set()  # batched calls in flight (kept alive)
        self.calls_sent = 0  # Ray calls to engines, batched or not
        self.groups_sent = 0

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
        """Generate on the least-loaded alive engine (see :class:`EnginePool`), in the next
        batched call to it.

        Raises:
            NoEngineAliveError: every engine is dead.
        """
        alive = self.alive_ids()
        if not alive:
            raise NoEngineAliveError("no rollout engine is alive")
        engine_id = min(alive, key=lambda e: (self._in_flight[e], e))
        request = GroupRequest(prompt, n_samples, group_index)
        self._in_flight[engine_id] += 1
        try:
            if self.max_groups_per_call == 1:
                return await self._call_one(engine_id, request)
            return await self._queue(engine_id, request)
        finally:
            self._in_flight[engine_id] -= 1

    async def _call_one(self, engine_id: str, request: GroupRequest) -> list[Sample]:
        self.calls_sent += 1
        self.groups_sent += 1
        try:
            return await self._engines[engine_id].generate.remote(*request)
        except ENGINE_FAILURES:
            self.mark_dead(engine_id)
            return _aborted(request, engine_id)

    def _queue(self, engine_id: str, request: GroupRequest) -> asyncio.Future[list[Sample]]:
        """Queue ``request`` for the engine's next call: sent once this turn of the event
        loop is over (every group started in it has joined), or at once when it is full."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(request, loop.create_future())
        queue = self._queued.setdefault(engine_id, [])
        queue.append(waiting)
        if len(queue) >= self.max_groups_per_call:
            self._send(engine_id)
        elif len(queue) == 1:
            loop.call_soon(self._send, engine_id)
        return waiting.samples

    def _send(self, engine_id: str) -> None:
        batch = self._queued.pop(engine_id, [])
        if not batch:
            return  # sent already, when it filled up
        self.calls_sent += 1
        self.groups_sent += len(batch)
        call = asyncio.get_running_loop().create_task(self._call_batch(engine_id, batch),
                                                      name=f"engine-call-{engine_id}")
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def _call_batch(self, engine_id: str, batch: list[_Waiting]) -> None:
        """One ``generate_batch`` call; every group's samples (or error) to its waiter. A
        waiter that was cancelled meanwhile (the producer paused) is skipped."""
        try:
            results = await self._engines[engine_id].generate_batch.remote(
                [waiting.request for waiting in batch])
        except ENGINE_FAILURES:
            self.mark_dead(engine_id)
            results = [_aborted(waiting.request, engine_id) for waiting in batch]
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.samples.cancel()
            raise
        except Exception as exc:  # each group's waiter raises the engine's error
            for waiting in batch:
                if not waiting.samples.done():
                    waiting.samples.set_exception(exc)
            return
        for waiting, samples in zip(batch, results, strict=True):
            if not waiting.samples.done():
                waiting.samples.set_result(samples)


def _aborted(request: GroupRequest, engine_id: str) -> list[Sample]:
    """The ABORTED samples of a request whose engine died under it."""
    return [
        Sample(
            index=request.group_index * request.n_samples + i,
            group_index=request.group_index,
            prompt_tokens=list(request.prompt.tokens),
            status=SampleStatus.ABORTED,
            metadata={"aborted_by": f"death of engine {engine_id}"},
        )
        for i in range(request.n_samples)
    ]
