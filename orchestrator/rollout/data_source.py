"""PromptSource: hands out prompts from a deterministic factory, in index order.

A prompt is fully determined by its index (``make_prompt(index)``), so the source's whole state
is the next index to hand out. Saving that position, plus the indices of prompts that were
handed out but not finished (the data buffer's job), is enough to lose no prompt on restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.rollout.types import Prompt

__all__ = ["PromptFactory", "PromptSource"]

PromptFactory = Callable[[int], Prompt]
"""``make_prompt(index) -> Prompt``: deterministic; the prompt's ``index`` must equal ``index``."""


class PromptSource:
    """Fresh prompts ``make_prompt(start_index), make_prompt(start_index + 1), ...``.

    Not thread-safe; one producer owns it.
    """

    def __init__(self, make_prompt: PromptFactory, start_index: int = 0) -> None:
        if start_index < 0:
            raise ValueError(f"start_index must be >= 0, got {start_index}")
        self._make_prompt = make_prompt
        self._next_index = start_index

    @property
    def next_index(self) -> int:
        """Index of the prompt the next :meth:`next` call returns."""
        return self._next_index

    def make(self, index: int) -> Prompt:
        """Rebuild the prompt at ``index`` without moving the position (used on restore).

        Raises:
            ValueError: the factory returned a prompt whose ``index`` is not ``index``.
        """
        prompt = self._make_prompt(index)
        if prompt.index != index:
            raise ValueError(f"make_prompt({index}) returned a prompt with index {prompt.index}")
        return prompt

    def next(self) -> Prompt:
        """Return the next fresh prompt and advance the position.

        Raises:
            ValueError: the factory broke its contract (see :meth:`make`); the position is
                not advanced.
        """
        prompt = self.make(self._next_index)
        self._next_index += 1
        return prompt

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the next index to hand out."""
        return {"next_index": self._next_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position saved by :meth:`state_dict`.

        Raises:
            ValueError: ``state`` has no valid non-negative integer ``next_index``.
        """
        next_index = state.get("next_index")
        if isinstance(next_index, bool) or not isinstance(next_index, int) or next_index < 0:
            raise ValueError(f"prompt source state needs next_index >= 0, got {next_index!r}")
        self._next_index = next_index
