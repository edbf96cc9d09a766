"""DataBuffer: finished groups waiting for a drain, the staleness filter, recycling, accounting.

Every prompt that enters the rollout is tracked by its index (a group's ``group_index`` is its
prompt's index) through exactly one state at a time::

    fresh prompt ──take_prompt──> IN_FLIGHT ──put──> BUFFERED ──get──> CLAIMED ──commit──> TRAINED
         ▲                          │  ▲               │   ▲              │
         │             return_prompt│  │take_prompt    │   └──release─────┘
         │                          ▼  │               ▼
         └── (restored) ───────> PENDING <──recycle── screen ──drop──> DROPPED(reason)

``get`` screens each buffered group against the current weight version: aborted, unversioned,
negative-staleness and stale groups are recycled (``retry``) or dropped (``drop``); groups the
dynamic filter rejects are dropped under both handlers (regenerating them would not add a GRPO
signal). A recycled prompt waits in the PENDING queue, which the producer takes before fresh
prompts, with ``recycle_count + 1``; a prompt already recycled ``max_recycles`` times is dropped
as ``starved`` instead. :meth:`DataBuffer.accounting` proves that none vanished (DESIGN
invariant 7): ``entered == in_flight + buffered + claimed + pending + trained + dropped``.

Single event loop, not thread-safe. Memory: one small entry per prompt ever entered (the
per-prompt outcome is kept for audits), which is negligible for the runs this project makes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.rollout.types import Group, Prompt

if TYPE_CHECKING:
    from orchestrator.config import RunConfig
    from orchestrator.rollout.data_source import PromptSource

__all__ = [
    "METRIC_PREFIX",
    "Accounting",
    "DataBuffer",
    "DropReason",
    "DynamicFilter",
    "PromptState",
    "VersionProvider",
    "reject_uniform_rewards",
]

logger = logging.getLogger(__name__)

METRIC_PREFIX = "rollout/fully_async/"

DynamicFilter = Callable[[Group], "str | None"]
"""``filter(group) -> None`` keeps the group; a string drops it, counted under that reason."""

VersionProvider = Callable[[int], int]
"""``current(at_least) -> version``: the weight version to measure staleness against.

Called once per screened group with that group's oldest version, so the provider can re-read
the ledger when the group is newer than what it knows. A result below ``at_least`` means a
negative staleness (a bug somewhere upstream): counted, and the group is not trained on.
"""


class PromptState(str, enum.Enum):
    """Where a prompt is; every prompt that entered is in exactly one state."""

    IN_FLIGHT = "in_flight"
    BUFFERED = "buffered"
    CLAIMED = "claimed"
    PENDING = "pending"
    TRAINED = "trained"
    DROPPED = "dropped"


class DropReason:
    """Reasons the buffer itself drops a prompt (dynamic filters add their own)."""

    ABORTED = "aborted"
    NEGATIVE_STALENESS = "negative_staleness"
    STALE = "stale"
    STARVED = "starved"


def reject_uniform_rewards(group: Group) -> str | None:
    """Dynamic filter: drop a group whose rewards are all equal (zero GRPO advantage)."""
    rewards = {sample.reward for sample in group.samples}
    return "no_signal" if len(rewards) <= 1 else None


@dataclass(frozen=True)
class Accounting:
    """Counts of prompts per state; ``balanced`` means none vanished (invariant 7)."""

    entered: int
    in_flight: int
    buffered: int
    claimed: int
    pending: int
    trained: int
    dropped: dict[str, int]

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def unaccounted(self) -> int:
        """Prompts that entered but are in no state; 0 unless the buffer has a bug."""
        accounted = (
            self.in_flight + self.buffered + self.claimed + self.pending + self.trained
        )
        return self.entered - accounted - self.dropped_total

    @property
    def balanced(self) -> bool:
        return self.unaccounted == 0


@dataclass
class _Entry:
    prompt: Prompt
    recycle_count: int
    state: PromptState
    staleness: int | None = None  # set while CLAIMED


@dataclass
class _StepStats:
    staleness: list[int] = field(default_factory=list)
    stale_filtered: int = 0
    aborted_filtered: int = 0
    dynamic_filtered: int = 0
    recycled: int = 0
    starved: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


class DataBuffer:
    """Bounded buffer of finished groups between the producer and the drain.

    Args:
        capacity: buffered groups at which :meth:`put` blocks (>= 1).
        max_weight_staleness: largest accepted ``current - oldest`` version lag; None = off.
        unused_samples_handler: ``retry`` recycles stale/aborted groups, ``drop`` drops them.
        max_recycles: recycles a prompt may get before it is dropped as ``starved``.
        dynamic_filter: optional :data:`DynamicFilter` applied to groups that pass staleness.
    """

    def __init__(
        self,
        capacity: int,
        *,
        max_weight_staleness: int | None = None,
        unused_samples_handler: Literal["drop", "retry"] = "retry",
        max_recycles: int = 3,
        dynamic_filter: DynamicFilter | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_weight_staleness is not None and max_weight_staleness < 0:
            raise ValueError(f"max_weight_staleness must be >= 0, got {max_weight_staleness}")
        if unused_samples_handler not in ("drop", "retry"):
            raise ValueError(
                f"unused_samples_handler must be drop|retry, got {unused_samples_handler!r}"
            )
        if max_recycles < 0:
            raise ValueError(f"max_recycles must be >= 0, got {max_recycles}")
        self.capacity = capacity
        self.max_weight_staleness = max_weight_staleness
        self.unused_samples_handler = unused_samples_handler
        self.max_recycles = max_recycles
        self.dynamic_filter = dynamic_filter

        self._live: dict[int, _Entry] = {}
        self._outcomes: dict[int, str] = {}  # terminal: "trained" or "dropped:<reason>"
        self._queue: deque[Group] = deque()  # BUFFERED groups, completion order
        self._pending: deque[int] = deque()  # PENDING prompt indices, taken before fresh ones
        self._changed = asyncio.Condition()
        self._notifiers: set[asyncio.Task[None]] = set()

        self._entered = 0
        self._trained = 0
        self._dropped: Counter[str] = Counter()
        self._negative_staleness_total = 0
        self._missing_version_total = 0
        self._recycled_total = 0
        self._step = _StepStats()

    @classmethod
    def from_config(
        cls, config: RunConfig, dynamic_filter: DynamicFilter | None = None
    ) -> DataBuffer:
        """A buffer sized and configured by ``config``."""
        return cls(
            config.buffer_capacity,
            max_weight_staleness=config.max_weight_staleness,
            unused_samples_handler=config.async_unused_samples_handler,
            max_recycles=config.max_recycles,
            dynamic_filter=dynamic_filter,
        )

    # ----------------------------------------------------------------- producer side

    def take_prompt(self, source: PromptSource) -> tuple[Prompt, int]:
        """Return the next prompt to generate and its recycle count; it is now IN_FLIGHT.

        Pending (recycled or returned) prompts come first, oldest first; then a fresh prompt
        from ``source``.

        Raises:
            Whatever ``source.next()`` raises; nothing changes in that case.
        """
        if self._pending:
            entry = self._live[self._pending.popleft()]
        else:
            prompt = source.next()
            if prompt.index in self._live or prompt.index in self._outcomes:
                raise ValueError(f"prompt {prompt.index} entered the rollout twice")
            entry = _Entry(prompt=prompt, recycle_count=0, state=PromptState.PENDING)
            self._live[prompt.index] = entry
            self._entered += 1
        entry.state = PromptState.IN_FLIGHT
        return entry.prompt, entry.recycle_count

    def return_prompt(self, prompt_index: int) -> None:
        """Put an IN_FLIGHT prompt back at the front of the pending queue, recycle count unchanged.

        For generations that were cancelled or failed: the prompt did nothing wrong.

        Raises:
            ValueError: the prompt is not IN_FLIGHT.
        """
        entry = self._entry(prompt_index, PromptState.IN_FLIGHT)
        entry.state = PromptState.PENDING
        self._pending.appendleft(prompt_index)

    async def put(self, group: Group) -> None:
        """Buffer a finished group, waiting while the buffer holds ``capacity`` groups.

        Cancel-safe: if cancelled while waiting, the group was not buffered and its prompt is
        still IN_FLIGHT (the caller returns it).

        Raises:
            ValueError: the group's prompt is not IN_FLIGHT (not taken from this buffer).
        """
        self._entry(group.group_index, PromptState.IN_FLIGHT)
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._queue) < self.capacity)
            entry = self._entry(group.group_index, PromptState.IN_FLIGHT)
            entry.state = PromptState.BUFFERED
            self._queue.append(group)
            self._changed.notify_all()

    # ----------------------------------------------------------------- consumer side

    async def get(self, current_version: VersionProvider | int) -> Group:
        """Wait for a buffered group that passes the screen; it is then CLAIMED.

        Each buffered group is screened in completion order against ``current_version``
        (an int, or a :data:`VersionProvider`); groups that fail are recycled or dropped as
        the module docstring says and counted in the step metrics. The caller must later
        :meth:`commit` (trained) or :meth:`release` (back to the buffer) every claimed group.

        Cancel-safe: a cancelled ``get`` has claimed nothing.

        Raises:
            Whatever ``current_version`` raises (e.g. a ledger error); the group being
            screened stays buffered at the front.
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
                    staleness = self._screen(group, resolve)
                    self._queue.popleft()
                    self._changed.notify_all()
                    if staleness is not None:
                        entry = self._live[group.group_index]
                        entry.state = PromptState.CLAIMED
                        entry.staleness = staleness
                        return group

    def commit(self, groups: list[Group]) -> None:
        """Mark CLAIMED groups as trained and record their staleness in the step metrics.

        Raises:
            ValueError: a group is not CLAIMED; nothing changes.
        """
        entries = [self._entry(g.group_index, PromptState.CLAIMED) for g in groups]
        for group, entry in zip(groups, entries):
            del self._live[group.group_index]
            self._outcomes[group.group_index] = PromptState.TRAINED.value
            self._trained += 1
            assert entry.staleness is not None
            self._step.staleness.append(entry.staleness)

    def release(self, groups: list[Group]) -> None:
        """Return CLAIMED groups to the front of the buffer, in their order (a failed drain).

        Raises:
            ValueError: a group is not CLAIMED; nothing changes.
        """
        entries = [self._entry(g.group_index, PromptState.CLAIMED) for g in groups]
        for group, entry in zip(reversed(groups), reversed(entries)):
            entry.state = PromptState.BUFFERED
            entry.staleness = None
            self._queue.appendleft(group)
        self._notify_soon()

    # ----------------------------------------------------------------- screening

    def _screen(self, group: Group, resolve: VersionProvider) -> int | None:
        """Return the group's staleness if it may be trained on, else recycle/drop it."""
        entry = self._entry(group.group_index, PromptState.BUFFERED)
        if group.aborted:
            self._step.aborted_filtered += 1
            self._recycle_or_drop(entry, DropReason.ABORTED)
            return None
        oldest = group.oldest_weight_version
        if oldest is None:
            self._missing_version_total += 1
            logger.error(
                "group %d has a sample without a weight version (invariant violation); "
                "recycling it", group.group_index,
            )
            self._recycle(entry)
            return None
        staleness = resolve(oldest) - oldest
        if staleness < 0:
            self._negative_staleness_total += 1
            logger.error(
                "group %d: negative staleness %d (oldest version %d is above the current "
                "version); not training on it", group.group_index, staleness, oldest,
            )
            self._recycle_or_drop(entry, DropReason.NEGATIVE_STALENESS)
            return None
        if self.max_weight_staleness is not None and staleness > self.max_weight_staleness:
            self._step.stale_filtered += 1
            self._recycle_or_drop(entry, DropReason.STALE)
            return None
        if self.dynamic_filter is not None:
            reason = self.dynamic_filter(group)
            if reason is not None:
                self._step.dynamic_filtered += 1
                self._drop(entry, str(reason))
                return None
        return staleness

    def _recycle_or_drop(self, entry: _Entry, reason: str) -> None:
        if self.unused_samples_handler == "retry":
            self._recycle(entry)
        else:
            self._drop(entry, reason)

    def _recycle(self, entry: _Entry) -> None:
        if entry.recycle_count >= self.max_recycles:
            self._step.starved += 1
            logger.warning(
                "prompt %d dropped as starved after %d recycles",
                entry.prompt.index, entry.recycle_count,
            )
            self._drop(entry, DropReason.STARVED)
            return
        entry.recycle_count += 1
        entry.state = PromptState.PENDING
        self._pending.append(entry.prompt.index)
        self._step.recycled += 1
        self._recycled_total += 1

    def _drop(self, entry: _Entry, reason: str) -> None:
        index = entry.prompt.index
        del self._live[index]
        self._outcomes[index] = f"{PromptState.DROPPED.value}:{reason}"
        self._dropped[reason] += 1
        self._step.dropped[reason] += 1

    # ----------------------------------------------------------------- introspection

    def state_of(self, prompt_index: int) -> PromptState | None:
        """The state of an unfinished prompt, or None if it is finished or unknown."""
        entry = self._live.get(prompt_index)
        return entry.state if entry else None

    @property
    def queue_size(self) -> int:
        """Groups buffered now (not counting claimed ones)."""
        return len(self._queue)

    @property
    def pending_count(self) -> int:
        """Prompts waiting in the recycle queue."""
        return len(self._pending)

    @property
    def in_flight_count(self) -> int:
        return sum(1 for e in self._live.values() if e.state is PromptState.IN_FLIGHT)

    @property
    def negative_staleness_total(self) -> int:
        return self._negative_staleness_total

    @property
    def missing_version_total(self) -> int:
        return self._missing_version_total

    @property
    def recycled_total(self) -> int:
        """Recycles since this buffer was created (not persisted)."""
        return self._recycled_total

    def accounting(self) -> Accounting:
        """Counts per state since this buffer (or the state it loaded) began."""
        per_state = Counter(entry.state for entry in self._live.values())
        return Accounting(
            entered=self._entered,
            in_flight=per_state[PromptState.IN_FLIGHT],
            buffered=per_state[PromptState.BUFFERED],
            claimed=per_state[PromptState.CLAIMED],
            pending=per_state[PromptState.PENDING],
            trained=self._trained,
            dropped=dict(self._dropped),
        )

    def prompt_states(self) -> dict[int, str]:
        """Every prompt index this buffer saw -> its state (``dropped:<reason>`` if dropped)."""
        states = dict(self._outcomes)
        states.update({index: entry.state.value for index, entry in self._live.items()})
        return states

    def recycle_counts(self) -> dict[int, int]:
        """Recycle count of every prompt that is not finished."""
        return {index: entry.recycle_count for index, entry in self._live.items()}

    def pop_step_metrics(self) -> dict[str, Any]:
        """This step's metrics (prefixed ``rollout/fully_async/``); resets the step counters.

        Staleness statistics cover the groups committed as trained since the last call.
        """
        step, self._step = self._step, _StepStats()
        lags = step.staleness
        metrics: dict[str, Any] = {
            "staleness_avg": sum(lags) / len(lags) if lags else 0.0,
            "staleness_max": max(lags) if lags else 0,
            "staleness_hist": dict(sorted(Counter(lags).items())),
            "trained": len(lags),
            "stale_filtered": step.stale_filtered,
            "aborted_filtered": step.aborted_filtered,
            "dynamic_filtered": step.dynamic_filtered,
            "recycled": step.recycled,
            "starved": step.starved,
            "dropped_total": sum(step.dropped.values()),
            "negative_staleness_total": self._negative_staleness_total,
            "missing_version_total": self._missing_version_total,
            "queue_size": len(self._queue),
            "recycle_queue_size": len(self._pending),
            "in_flight": self.in_flight_count,
        }
        for reason, count in sorted(step.dropped.items()):
            metrics[f"dropped/{reason}"] = count
        return {METRIC_PREFIX + key: value for key, value in metrics.items()}

    # ----------------------------------------------------------------- persistence

    def state_dict(self) -> dict[str, Any]:
        """JSON-able snapshot: every unfinished prompt as ``[index, recycle_count]``, plus totals.

        Unfinished prompts (pending, claimed, buffered, in flight) are all saved as pending,
        pending ones first: a restored buffer regenerates them, so none is lost. A prompt
        trained after the snapshot is regenerated if the snapshot is restored (at least once).
        """
        order = list(self._pending)
        order += [g.group_index for g in self._queue]
        order += [i for i, e in self._live.items() if e.state is PromptState.CLAIMED]
        order += [i for i, e in self._live.items() if e.state is PromptState.IN_FLIGHT]
        return {
            "pending": [[index, self._live[index].recycle_count] for index in order],
            "entered": self._entered,
            "trained": self._trained,
            "dropped": dict(self._dropped),
            "negative_staleness_total": self._negative_staleness_total,
            "missing_version_total": self._missing_version_total,
        }

    def load_state_dict(self, state: dict[str, Any], make_prompt: Callable[[int], Prompt]) -> None:
        """Restore a :meth:`state_dict` into this empty buffer; saved prompts become PENDING.

        Raises:
            RuntimeError: the buffer already tracks prompts.
            ValueError: the state is malformed; the buffer is left empty.
        """
        if self._live or self._outcomes or self._entered:
            raise RuntimeError("load_state_dict needs an empty buffer")
        try:
            pending = [(int(index), int(count)) for index, count in state["pending"]]
            entries = {index: _Entry(make_prompt(index), count, PromptState.PENDING)
                       for index, count in pending}
            totals = (int(state["entered"]), int(state["trained"]))
            dropped = Counter({str(k): int(v) for k, v in state["dropped"].items()})
            negative = int(state["negative_staleness_total"])
            missing = int(state["missing_version_total"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed data buffer state: {exc!r}") from None
        if len(entries) != len(pending):
            raise ValueError("malformed data buffer state: a prompt is listed twice")
        self._live = entries
        self._pending = deque(index for index, _ in pending)
        self._entered, self._trained = totals
        self._dropped = dropped
        self._negative_staleness_total = negative
        self._missing_version_total = missing

    # ----------------------------------------------------------------- helpers

    def _entry(self, prompt_index: int, expected: PromptState) -> _Entry:
        entry = self._live.get(prompt_index)
        if entry is None or entry.state is not expected:
            found = entry.state.value if entry else self._outcomes.get(prompt_index, "unknown")
            raise ValueError(f"prompt {prompt_index} is {found}, expected {expected.value}")
        return entry

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
