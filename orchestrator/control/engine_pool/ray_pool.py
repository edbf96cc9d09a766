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

A call that an engine never took (lost on the way, or answered into the void) would strand its
groups: in flight until the run ends, and the engine starved by the least-loaded dispatch. So
the pool watches its old calls (:class:`LostCallPolicy`): once a call has waited
``lost_after_s``, the pool reads its engine's ``health`` every ``check_interval_s``. A call of
which the engine holds no group (``groups_in_flight``) while it has a free call slot (its
``calls`` and the pool's own calls to it both below its ``max_calls``: the call cannot be
queued behind others), at ``checks_to_give_up`` checks in a row, is lost: its groups come back ABORTED, the pool logs it and counts it in
``calls_lost``. A slow call is never given up: its engine holds its groups. One that its
engine has held past ``slow_warning_s`` is logged once, with the engine's health (a call stuck
inside an engine shows there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from orchestrator.errors import NoEngineAliveError
from orchestrator.rollout.types import GroupRequest, Prompt, Sample, SampleStatus

__all__ = ["DEFAULT_MAX_GROUPS_PER_CALL", "LostCallPolicy", "NoEngineAliveError",
           "RayEnginePool"]

logger = logging.getLogger(__name__)

ENGINE_FAILURES = (ActorDiedError, ActorUnavailableError, RayActorError)
DEFAULT_MAX_GROUPS_PER_CALL = 8


@dataclass(frozen=True)
class LostCallPolicy:
    """When the pool gives a call up as lost (see the module docstring): it checks calls that
    waited ``lost_after_s``, every ``check_interval_s``, each engine's ``health`` bounded by
    ``health_timeout_s`` (no answer: no verdict), and gives a call up after
    ``checks_to_give_up`` checks in a row found none of its groups on a free engine. A call
    held past ``slow_warning_s`` is logged once."""

    lost_after_s: float = 5.0
    check_interval_s: float = 2.0
    health_timeout_s: float = 10.0
    checks_to_give_up: int = 2
    slow_warning_s: float = 120.0


@dataclass
class _Waiting:
    """A group queued for an engine's next batched call, and where its samples go."""

    request: GroupRequest
    samples: asyncio.Future[list[Sample]]


@dataclass(eq=False)
class _Call:
    """A call sent to an engine and not yet answered."""

    engine_id: str
    batch: list[_Waiting]
    sent_at: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    absent_checks: int = 0  # checks in a row that found none of its groups on the engine
    warned: bool = False  # logged as slow


class RayEnginePool:
    """Least-loaded dispatch over named engine actor handles, groups batched per engine.

    Args:
        engines: engine id -> Ray actor handle of a ``RolloutEngine``.
        max_groups_per_call: groups in one engine call at most (``RunConfig``'s
            ``engine_call_max_groups``); 1 sends one ``generate`` call per group.
        lost_calls: when a call is given up as lost.
    """

    def __init__(self, engines: dict[str, Any],
                 max_groups_per_call: int = DEFAULT_MAX_GROUPS_PER_CALL,
                 lost_calls: LostCallPolicy = LostCallPolicy()) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        if max_groups_per_call < 1:
            raise ValueError(f"max_groups_per_call must be >= 1, got {max_groups_per_call}")
        self._engines = dict(engines)
        self._in_flight = {engine_id: 0 for engine_id in engines}
        self._dead: set[str] = set()
        self.max_groups_per_call = max_groups_per_call
        self._queued: dict[str, list[_Waiting]] = {}
        self._calls: set[_Call] = set()  # sent, not answered (their tasks kept alive here)
        self.lost_calls = lost_calls
        self._watch: asyncio.Task[None] | None = None
        self.calls_sent = 0  # Ray calls to engines, batched or not
        self.groups_sent = 0
        self.calls_lost = 0

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
            return await self._queue(engine_id, request)
        finally:
            self._in_flight[engine_id] -= 1

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
        loop = asyncio.get_running_loop()
        call = _Call(engine_id, batch)
        call.task = loop.create_task(self._call(call), name=f"engine-call-{engine_id}")
        self._calls.add(call)
        if self._watch is None or self._watch.done():
            self._watch = loop.create_task(self._watch_calls(), name="engine-call-watch")

    async def _call(self, call: _Call) -> None:
        """One ``generate_batch`` call (``generate`` when batching is off); every group's
        samples (or error) to its waiter. A waiter done meanwhile (cancelled as the producer
        paused, or its call given up as lost) is skipped."""
        engine_id, batch = call.engine_id, call.batch
        try:
            engine = self._engines[engine_id]
            if self.max_groups_per_call == 1:
                results = [await engine.generate.remote(*batch[0].request)]
            else:
                results = await engine.generate_batch.remote([w.request for w in batch])
        except ENGINE_FAILURES:
            if self._engines.get(engine_id) is engine:  # not an engine replaced since
                self.mark_dead(engine_id)
            results = [_aborted(w.request, f"death of engine {engine_id}") for w in batch]
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.samples.cancel()
            raise
        except Exception as exc:  # each group's waiter raises the engine's error
            for waiting in batch:
                if not waiting.samples.done():
                    waiting.samples.set_exception(exc)
            return
        finally:
            self._calls.discard(call)
        for waiting, samples in zip(batch, results, strict=True):
            if not waiting.samples.done():
                waiting.samples.set_result(samples)

    async def _watch_calls(self) -> None:
        """While calls are unanswered: check those that waited ``lost_after_s`` against
        their engine's ``health``, and give up the lost ones."""
        policy = self.lost_calls
        while self._calls:
            await asyncio.sleep(policy.check_interval_s)
            now = time.monotonic()
            old = [call for call in self._calls if now - call.sent_at >= policy.lost_after_s]
            for engine_id in sorted({call.engine_id for call in old}):
                health = await self._health(engine_id)
                if health is not None:
                    self._check(engine_id, health,
                                [c for c in old if c.engine_id == engine_id and c in self._calls])

    async def _health(self, engine_id: str) -> dict[str, Any] | None:
        """The engine's ``health``; None if it gave none in time (a dead or frozen engine is
        the supervisor's to replace, not a verdict on the call)."""
        try:
            return await asyncio.wait_for(self._engines[engine_id].health.remote(),
                                          self.lost_calls.health_timeout_s)
        except Exception as exc:  # TimeoutError, a Ray actor error: no answer either way
            logger.debug("engine %s gave no health to check its calls: %s", engine_id, exc)
            return None

    def _check(self, engine_id: str, health: dict[str, Any], calls: list[_Call]) -> None:
        held = set(health.get("groups_in_flight", ()))
        ours = sum(1 for call in self._calls if call.engine_id == engine_id)
        free_slot = max(health.get("calls", 0), ours) < health.get("max_calls", 0)
        for call in calls:
            if not free_slot or any(w.request.group_index in held for w in call.batch):
                call.absent_checks = 0
                self._warn_if_slow(call, health)
                continue
            call.absent_checks += 1
            if call.absent_checks >= self.lost_calls.checks_to_give_up:
                self._give_up(call)

    def _warn_if_slow(self, call: _Call, health: dict[str, Any]) -> None:
        waited = time.monotonic() - call.sent_at
        if call.warned or waited < self.lost_calls.slow_warning_s:
            return
        call.warned = True
        logger.warning("engine %s has held a call of groups %s for %.0f s; its health: %s",
                       call.engine_id, [w.request.group_index for w in call.batch], waited,
                       health)

    def _give_up(self, call: _Call) -> None:
        """Its groups back ABORTED (recycled); an answer that comes later is dropped."""
        self._calls.discard(call)
        self.calls_lost += 1
        groups = [w.request.group_index for w in call.batch]
        waited = time.monotonic() - call.sent_at
        logger.warning("engine %s never took a call of groups %s sent %.1f s ago (it holds "
                       "none of them and has a free call slot): given up, the groups are "
                       "generated again", call.engine_id, groups, waited)
        reason = f"call lost by engine {call.engine_id}"
        for waiting in call.batch:
            if not waiting.samples.done():
                waiting.samples.set_result(_aborted(waiting.request, reason))
        if call.task is not None:
            call.task.cancel()


def _aborted(request: GroupRequest, reason: str) -> list[Sample]:
    """The ABORTED samples of a request whose engine died under it, or lost it."""
    return [
        Sample(
            index=request.group_index * request.n_samples + i,
            group_index=request.group_index,
            prompt_tokens=list(request.prompt.tokens),
            status=SampleStatus.ABORTED,
            metadata={"aborted_by": reason},
        )
        for i in range(request.n_samples)
    ]
