"""Prompt accounting and recycling: where every prompt that entered the rollout is.

Every prompt is tracked by its index (a group's ``group_index`` is its prompt's index) through
exactly one state at a time::

    fresh prompt ──take_prompt──> IN_FLIGHT ──put──> BUFFERED ──get──> CLAIMED ──commit──> TRAINED
         ▲                          │  ▲               │   ▲              │
         │             return_prompt│  │take_prompt    │   └──release─────┘
         │                          ▼  │               ▼
         └── (restored) ───────> PENDING <──recycle── screen ──drop──> DROPPED(reason)

(the arrows are named for the :class:`~orchestrator.rollout.data_buffer.DataBuffer` calls that
drive them; this module keeps the states, the buffer keeps the groups).

PENDING prompts (recycled, given back, or restored) are taken before fresh ones, oldest first; a
given-back prompt goes to the front. A recycled prompt gets ``recycle_count + 1``; one already
recycled ``max_recycles`` times is dropped as ``starved`` instead, so a slow prompt cannot cycle
for ever. :meth:`PromptTracker.accounting` proves that none vanished (DESIGN invariant 7):
``entered == in_flight + buffered + claimed + pending + trained + dropped``.

Single event loop, not thread-safe. Memory: one small entry per prompt ever entered (the
per-prompt outcome is kept for audits), which is negligible for the runs this project makes.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.rollout.data_source import PromptFactory, PromptSource
from orchestrator.rollout.types import Prompt

__all__ = ["STARVED", "Accounting", "PromptState", "PromptTracker"]

logger = logging.getLogger(__name__)

STARVED = "starved"
"""Drop reason of a prompt recycled ``max_recycles`` times that needed another recycle."""


class PromptState(str, enum.Enum):
    """Where a prompt is; every prompt that entered is in exactly one state."""

    IN_FLIGHT = "in_flight"
    BUFFERED = "buffered"
    CLAIMED = "claimed"
    PENDING = "pending"
    TRAINED = "trained"
    DROPPED = "dropped"


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
        """Prompts dropped, whatever the reason."""
        return sum(self.dropped.values())

    @property
    def unaccounted(self) -> int:
        """Prompts that entered but are in no state; 0 unless the tracker has a bug."""
        accounted = (
            self.in_flight + self.buffered + self.claimed + self.pending + self.trained
        )
        return self.entered - accounted - self.dropped_total

    @property
    def balanced(self) -> bool:
        """True if every prompt that entered is in exactly one state (invariant 7)."""
        return self.unaccounted == 0


@dataclass
class _Entry:
    prompt: Prompt
    recycle_count: int
    state: PromptState


class PromptTracker:
    """The state of every prompt of one rollout, and the queue of PENDING prompts.

    Args:
        max_recycles: recycles a prompt may get before it is dropped as ``starved`` (>= 0).

    Every transition checks the prompt's current state and raises ``ValueError`` (changing
    nothing) if it is not the expected one.
    """

    def __init__(self, max_recycles: int = 3) -> None:
        if max_recycles < 0:
            raise ValueError(f"max_recycles must be >= 0, got {max_recycles}")
        self.max_recycles = max_recycles
        self._live: dict[int, _Entry] = {}
        self._outcomes: dict[int, str] = {}  # terminal: "trained" or "dropped:<reason>"
        self._drop_reasons: dict[int, str] = {}  # the dropped ones of _outcomes: index -> reason
        self._pending: deque[int] = deque()
        self._entered = 0
        self._trained = 0
        self._dropped: Counter[str] = Counter()

    # ----------------------------------------------------------------- transitions

    def take(self, source: PromptSource) -> tuple[Prompt, int]:
        """Return the next prompt to generate and its recycle count; it is now IN_FLIGHT.

        Pending prompts come first, oldest first; then a fresh prompt from ``source``.

        Raises:
            ValueError: the fresh prompt's index entered before (a broken source).
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

    def give_back(self, prompt_index: int) -> None:
        """IN_FLIGHT -> front of PENDING, recycle count unchanged (the prompt did nothing wrong)."""
        self.expect(prompt_index, PromptState.IN_FLIGHT).state = PromptState.PENDING
        self._pending.appendleft(prompt_index)

    def move(self, prompt_index: int, expected: PromptState, new: PromptState) -> None:
        """Move a prompt between the live states IN_FLIGHT, BUFFERED and CLAIMED."""
        self.expect(prompt_index, expected).state = new

    def recycle(self, prompt_index: int, expected: PromptState) -> bool:
        """Send a prompt back to PENDING (end of the queue) with ``recycle_count + 1``.

        Returns False, having dropped it as ``starved``, if it was already recycled
        ``max_recycles`` times.
        """
        entry = self.expect(prompt_index, expected)
        if entry.recycle_count >= self.max_recycles:
            logger.warning(
                "prompt %d dropped as starved after %d recycles", prompt_index, entry.recycle_count
            )
            self.drop(prompt_index, expected, STARVED)
            return False
        entry.recycle_count += 1
        entry.state = PromptState.PENDING
        self._pending.append(prompt_index)
        return True

    def drop(self, prompt_index: int, expected: PromptState, reason: str) -> None:
        """Finish a prompt as ``dropped:<reason>``."""
        self.expect(prompt_index, expected)
        del self._live[prompt_index]
        self._outcomes[prompt_index] = f"{PromptState.DROPPED.value}:{reason}"
        self._drop_reasons[prompt_index] = reason
        self._dropped[reason] += 1

    def train(self, prompt_indices: Iterable[int]) -> None:
        """Finish CLAIMED prompts as ``trained``; all or none (checked first)."""
        indices = list(prompt_indices)
        for index in indices:
            self.expect(index, PromptState.CLAIMED)
        for index in indices:
            del self._live[index]
            self._outcomes[index] = PromptState.TRAINED.value
            self._trained += 1

    def expect(self, prompt_index: int, expected: PromptState) -> _Entry:
        """The prompt's entry if it is in state ``expected``.

        Raises:
            ValueError: it is in another state, finished, or unknown.
        """
        entry = self._live.get(prompt_index)
        if entry is None or entry.state is not expected:
            found = entry.state.value if entry else self._outcomes.get(prompt_index, "unknown")
            raise ValueError(f"prompt {prompt_index} is {found}, expected {expected.value}")
        return entry

    # ----------------------------------------------------------------- introspection

    def state_of(self, prompt_index: int) -> PromptState | None:
        """The state of an unfinished prompt, or None if it is finished or unknown."""
        entry = self._live.get(prompt_index)
        return entry.state if entry else None

    @property
    def is_empty(self) -> bool:
        """True until the first prompt enters (or a saved state is loaded)."""
        return not (self._live or self._outcomes or self._entered)

    @property
    def pending_count(self) -> int:
        """Prompts waiting in the PENDING queue."""
        return len(self._pending)

    @property
    def in_flight_count(self) -> int:
        """Prompts IN_FLIGHT now."""
        return sum(1 for entry in self._live.values() if entry.state is PromptState.IN_FLIGHT)

    def accounting(self) -> Accounting:
        """Counts per state since this tracker (or the state it loaded) began."""
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
        """Every prompt index seen -> its state (``dropped:<reason>`` if dropped)."""
        states = dict(self._outcomes)
        states.update({index: entry.state.value for index, entry in self._live.items()})
        return states

    def dropped_prompts(self) -> dict[int, str]:
        """Every prompt this tracker dropped -> the reason (few: a small map, unlike
        :meth:`prompt_states`, which grows with every prompt of the run)."""
        return dict(self._drop_reasons)

    def recycle_counts(self) -> dict[int, int]:
        """Recycle count of every prompt that is not finished."""
        return {index: entry.recycle_count for index, entry in self._live.items()}

    # ----------------------------------------------------------------- persistence

    def state_dict(self, buffered_order: Iterable[int]) -> dict[str, Any]:
        """JSON-able snapshot: every unfinished prompt as ``[index, recycle_count]``, plus totals.

        Unfinished prompts are listed in the order a restored tracker should regenerate them:
        pending first, then buffered (in ``buffered_order``, the buffer's queue order), claimed
        and in flight.
        """
        order = list(self._pending) + list(buffered_order)
        for state in (PromptState.CLAIMED, PromptState.IN_FLIGHT):
            order += [index for index, entry in self._live.items() if entry.state is state]
        return {
            "pending": [[index, self._live[index].recycle_count] for index in order],
            "entered": self._entered,
            "trained": self._trained,
            "dropped": dict(self._dropped),
        }

    def load_state_dict(self, state: dict[str, Any], make_prompt: PromptFactory) -> None:
        """Restore a :meth:`state_dict` into this empty tracker; saved prompts become PENDING.

        Raises:
            RuntimeError: the tracker already tracks prompts.
            ValueError: the state is malformed; the tracker is left empty.
        """
        if not self.is_empty:
            raise RuntimeError("load_state_dict needs an empty buffer")
        try:
            pending = [(int(index), int(count)) for index, count in state["pending"]]
            entries = {index: _Entry(make_prompt(index), count, PromptState.PENDING)
                       for index, count in pending}
            entered, trained = int(state["entered"]), int(state["trained"])
            dropped = Counter({str(k): int(v) for k, v in state["dropped"].items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed data buffer state: {exc!r}") from None
        if len(entries) != len(pending):
            raise ValueError("malformed data buffer state: a prompt is listed twice")
        self._live = entries
        self._pending = deque(index for index, _ in pending)
        self._entered, self._trained = entered, trained
        self._dropped = dropped
