"""DataBuffer: the bounded queue of finished groups between the producer and the drain.

The producer takes prompts (:meth:`DataBuffer.take_prompt`) and puts finished groups
(:meth:`~DataBuffer.put`, which waits while the buffer is full); the drain gets groups
(:meth:`~DataBuffer.get`) and then commits them as trained or releases them back. The buffer
wires together three parts, each in its own module:

* :mod:`~orchestrator.rollout.prompt_tracker`: the state of every prompt, the PENDING queue
  of recycled prompts, starvation, and the accounting of DESIGN invariant 7;
* :mod:`~orchestrator.rollout.staleness`: the screen that decides, as ``get`` takes each
  buffered group, whether it is trained on, recycled or dropped;
* :mod:`~orchestrator.rollout.step_metrics`: the per-step metrics of all that.

It also reports what the admission bound counts (:meth:`DataBuffer.admission_load`) and tells
its slot listeners whenever a group leaves without being trained (recycled, dropped, or its
prompt given back), so a producer held back by the bound looks again.

Single event loop, not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from orchestrator.rollout.admission import AdmissionLoad
from orchestrator.rollout.data_source import PromptFactory, PromptSource
from orchestrator.rollout.errors import RewardErrorsExceededError
from orchestrator.rollout.prompt_tracker import STARVED, Accounting, PromptState, PromptTracker
from orchestrator.rollout.staleness import (
    Action,
    DynamicFilter,
    Rejection,
    StalenessFilter,
    Verdict,
    VersionProvider,
)
from orchestrator.rollout.step_metrics import StepMetrics
from orchestrator.rollout.types import Group, Prompt, RolloutConfig

__all__ = ["DataBuffer"]


class DataBuffer:
    """Bounded buffer of finished groups between the producer and the drain.

    Args:
        capacity: buffered groups at which :meth:`put` blocks (>= 1).
        max_weight_staleness: largest accepted ``current - oldest`` version lag; None = off.
        unused_samples_handler: ``retry`` recycles stale/aborted groups, ``drop`` drops them.
        max_recycles: recycles a prompt may get before it is dropped as ``starved``.
        dynamic_filter: optional :data:`~orchestrator.rollout.staleness.DynamicFilter` applied
            to groups that pass staleness.
        max_partial_span: largest accepted version span of a sample (partial rollout);
            None = off.
        reward_error_budget: ``reward_error`` drops one step (one drain) tolerates; one more
            makes :meth:`get` raise :class:`RewardErrorsExceededError`. None = no limit.

    Raises:
        ValueError: an option is out of range.
    """

    def __init__(
        self,
        capacity: int,
        *,
        max_weight_staleness: int | None = None,
        unused_samples_handler: Literal["drop", "retry"] = "retry",
        max_recycles: int = 3,
        dynamic_filter: DynamicFilter | None = None,
        max_partial_span: int | None = None,
        reward_error_budget: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._screen = StalenessFilter(max_weight_staleness, unused_samples_handler,
                                       dynamic_filter, max_partial_span)
        self._slot_listeners: list[Callable[[], None]] = []
        self._prompts = PromptTracker(max_recycles)
        self._metrics = StepMetrics()
        self._queue: deque[Group] = deque()  # BUFFERED groups, completion order
        self._claimed_staleness: dict[int, int] = {}  # CLAIMED prompt index -> staleness
        self._changed = asyncio.Condition()
        self._notifiers: set[asyncio.Task[None]] = set()
        self._reward_error_budget = reward_error_budget
        self._step_reward_errors = 0

    @classmethod
    def from_config(
        cls, config: RolloutConfig, dynamic_filter: DynamicFilter | None = None
    ) -> DataBuffer:
        """A buffer sized and configured by ``config``."""
        return cls(
            config.buffer_capacity,
            max_weight_staleness=config.max_weight_staleness,
            unused_samples_handler=config.async_unused_samples_handler,
            max_recycles=config.max_recycles,
            dynamic_filter=dynamic_filter,
            max_partial_span=config.max_partial_span,
            reward_error_budget=int(config.reward_error_limit * config.rollout_batch_size),
        )

    # ----------------------------------------------------------------- producer side

    def take_prompt(self, source: PromptSource) -> tuple[Prompt, int]:
        """Return the next prompt to generate and its recycle count; it is now IN_FLIGHT.

        Pending (recycled or returned) prompts come first, oldest first; then a fresh prompt
        from ``source``. A prompt with a ``drop_reason`` (``too_long``) is settled as dropped
        under it and the next one is taken: it is never generated. (A source must yield a
        prompt without a drop reason eventually; the data-set loader refuses data where none
        fits.)

        Raises:
            Whatever ``source.next()`` raises; nothing changes in that case.
        """
        while True:
            prompt, recycle_count = self._prompts.take(source)
            if prompt.drop_reason is None:
                return prompt, recycle_count
            self._prompts.drop(prompt.index, PromptState.IN_FLIGHT, prompt.drop_reason)
            self._metrics.dropped(prompt.drop_reason)

    def return_prompt(self, prompt_index: int) -> None:
        """Put an IN_FLIGHT prompt back at the front of the pending queue, recycle count unchanged.

        For generations that were cancelled or failed: the prompt did nothing wrong.

        Raises:
            ValueError: the prompt is not IN_FLIGHT.
        """
        self._prompts.give_back(prompt_index)
        self._slot_freed()

    async def put(self, group: Group) -> None:
        """Buffer a finished group, waiting while the buffer holds ``capacity`` groups.

        Cancel-safe: if cancelled while waiting, the group was not buffered and its prompt is
        still IN_FLIGHT (the caller returns it).

        Raises:
            ValueError: the group's prompt is not IN_FLIGHT (not taken from this buffer).
        """
        self._prompts.expect(group.group_index, PromptState.IN_FLIGHT)
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._queue) < self.capacity)
            self._prompts.move(group.group_index, PromptState.IN_FLIGHT, PromptState.BUFFERED)
            self._queue.append(group)
            self._changed.notify_all()

    # ----------------------------------------------------------------- consumer side

    async def get(self, current_version: VersionProvider | int) -> Group:
        """Wait for a buffered group that passes the screen; it is then CLAIMED.

        Each buffered group is screened in completion order against ``current_version``
        (an int, or a :data:`~orchestrator.rollout.staleness.VersionProvider`); groups that
        fail are recycled or dropped as :mod:`~orchestrator.rollout.staleness` says and counted
        in the step metrics. The caller must later :meth:`commit` (trained) or :meth:`release`
        (back to the buffer) every claimed group.

        Cancel-safe: a cancelled ``get`` has claimed nothing.

        Raises:
            Whatever ``current_version`` raises (e.g. a ledger error); the group being
            screened stays buffered at the front.
            RewardErrorsExceededError: this step's ``reward_error`` drops passed the budget
                (the group is dropped first).
        """
        if callable(current_version):
            resolve: VersionProvider = current_version
        else:
            fixed = current_version

            def resolve(_at_least: int) -> int:
                return fixed
        async with self._changed:
            while True:
                await self._changed.wait_for(lambda: bool(self._queue))
                while self._queue:
                    group = self._queue[0]
                    self._prompts.expect(group.group_index, PromptState.BUFFERED)
                    verdict = self._screen.screen(group, resolve)
                    self._queue.popleft()
                    self._changed.notify_all()
                    if self._carry_out(group, verdict):
                        return group
                    self._slot_freed()
                    self._check_reward_errors(verdict)

    def commit(self, groups: list[Group]) -> None:
        """Mark CLAIMED groups as trained and record their staleness in the step metrics.

        Raises:
            ValueError: a group is not CLAIMED; nothing changes.
        """
        self._prompts.train(group.group_index for group in groups)
        for group in groups:
            self._metrics.trained(self._claimed_staleness.pop(group.group_index), group)

    def release(self, groups: list[Group]) -> None:
        """Return CLAIMED groups to the front of the buffer, in their order (a failed drain).

        Raises:
            ValueError: a group is not CLAIMED; nothing changes.
        """
        for group in groups:
            self._prompts.expect(group.group_index, PromptState.CLAIMED)
        for group in reversed(groups):
            self._prompts.move(group.group_index, PromptState.CLAIMED, PromptState.BUFFERED)
            del self._claimed_staleness[group.group_index]
            self._queue.appendleft(group)
        self._notify_soon()

    def _carry_out(self, group: Group, verdict: Verdict) -> bool:
        """Apply the screen's verdict to a BUFFERED group; True if it is now CLAIMED."""
        prompt_index = group.group_index
        if verdict.action is Action.TRAIN:
            assert verdict.staleness is not None
            self._prompts.move(prompt_index, PromptState.BUFFERED, PromptState.CLAIMED)
            self._claimed_staleness[prompt_index] = verdict.staleness
            return True
        self._metrics.screened(verdict, group)
        assert verdict.reason is not None
        if verdict.action is Action.RECYCLE:
            if self._prompts.recycle(prompt_index, PromptState.BUFFERED):
                self._metrics.recycled()
                return False
            self._metrics.starved()
            self._metrics.dropped(STARVED)
            return False
        self._prompts.drop(prompt_index, PromptState.BUFFERED, verdict.reason)
        self._metrics.dropped(verdict.reason)
        return False

    # ----------------------------------------------------------------- admission

    def add_slot_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a group leaves without being trained (recycled,
        dropped) or an in-flight prompt is given back: a slot of the admission bound freed."""
        self._slot_listeners.append(listener)

    def admission_load(self) -> AdmissionLoad:
        """What the admission bound counts: trained, queued (buffered + claimed), in flight."""
        accounting = self._prompts.accounting()
        return AdmissionLoad(
            trained=accounting.trained,
            queued=accounting.buffered + accounting.claimed,
            in_flight=accounting.in_flight,
        )

    def _slot_freed(self) -> None:
        for listener in self._slot_listeners:
            listener()

    # ----------------------------------------------------------------- introspection

    def state_of(self, prompt_index: int) -> PromptState | None:
        """The state of an unfinished prompt, or None if it is finished or unknown."""
        return self._prompts.state_of(prompt_index)

    @property
    def queue_size(self) -> int:
        """Groups buffered now (not counting claimed ones)."""
        return len(self._queue)

    @property
    def pending_count(self) -> int:
        """Prompts waiting in the recycle queue."""
        return self._prompts.pending_count

    @property
    def in_flight_count(self) -> int:
        """Prompts being generated now (taken, not yet buffered)."""
        return self._prompts.in_flight_count

    @property
    def negative_staleness_total(self) -> int:
        """Groups screened with a negative staleness, ever (saved with the state); must be 0."""
        return self._metrics.negative_staleness_total

    @property
    def missing_version_total(self) -> int:
        """Groups screened with an unstamped sample, ever (saved with the state); must be 0."""
        return self._metrics.missing_version_total

    @property
    def recycled_total(self) -> int:
        """Recycles since this buffer was created (not persisted)."""
        return self._metrics.recycled_total

    def accounting(self) -> Accounting:
        """Counts per state since this buffer (or the state it loaded) began."""
        return self._prompts.accounting()

    def prompt_states(self) -> dict[int, str]:
        """Every prompt index this buffer saw -> its state (``dropped:<reason>`` if dropped)."""
        return self._prompts.prompt_states()

    def dropped_prompts(self) -> dict[int, str]:
        """Every prompt this buffer dropped -> the reason."""
        return self._prompts.dropped_prompts()

    def recycle_counts(self) -> dict[int, int]:
        """Recycle count of every prompt that is not finished."""
        return self._prompts.recycle_counts()

    def _check_reward_errors(self, verdict: Verdict) -> None:
        if verdict.rejection is not Rejection.REWARD_ERROR:
            return
        self._step_reward_errors += 1
        budget = self._reward_error_budget
        if budget is not None and self._step_reward_errors > budget:
            raise RewardErrorsExceededError(
                f"{self._step_reward_errors} groups of one step dropped as reward_error (the "
                f"limit allows {budget}): the reward function raises (see the engines' log)")

    def pop_step_metrics(self) -> dict[str, Any]:
        """This step's metrics (prefixed ``rollout/fully_async/``); resets the step counters.

        Staleness statistics cover the groups committed as trained since the last call.
        """
        self._step_reward_errors = 0
        return self._metrics.pop(
            queue_size=len(self._queue),
            recycle_queue_size=self._prompts.pending_count,
            in_flight=self._prompts.in_flight_count,
        )

    # ----------------------------------------------------------------- persistence

    def state_dict(self) -> dict[str, Any]:
        """JSON-able snapshot: every unfinished prompt as ``[index, recycle_count]``, plus totals.

        Unfinished prompts (pending, claimed, buffered, in flight) are all saved as pending,
        pending ones first: a restored buffer regenerates them, so none is lost. A prompt
        trained after the snapshot is regenerated if the snapshot is restored (at least once).
        """
        state = self._prompts.state_dict(group.group_index for group in self._queue)
        state["negative_staleness_total"] = self._metrics.negative_staleness_total
        state["missing_version_total"] = self._metrics.missing_version_total
        return state

    def load_state_dict(self, state: dict[str, Any], make_prompt: PromptFactory) -> None:
        """Restore a :meth:`state_dict` into this empty buffer; saved prompts become PENDING.

        Raises:
            RuntimeError: the buffer already tracks prompts.
            ValueError: the state is malformed; the buffer is left empty.
        """
        if not self._prompts.is_empty:
            raise RuntimeError("load_state_dict needs an empty buffer")
        try:
            negative = int(state["negative_staleness_total"])
            missing = int(state["missing_version_total"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed data buffer state: {exc!r}") from None
        self._prompts.load_state_dict(state, make_prompt)
        self._metrics.negative_staleness_total = negative
        self._metrics.missing_version_total = missing

    # ----------------------------------------------------------------- helpers

    def _notify_soon(self) -> None:
        # Waking waiters needs the condition's lock, which sync callers cannot take.
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(notify())
        self._notifiers.add(task)  # keep a reference until it ran
        task.add_done_callback(self._notifiers.discard)
