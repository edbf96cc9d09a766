"""DatasetPrompts: the prompt stream over a data set, position -> (epoch, row) -> Prompt.

The stream is infinite and deterministic: position ``p`` is row ``order(e)[p % n]`` of epoch
``e = p // n`` (``n`` the data set's rows; ``order(e)`` the identity, or with
``rollout_shuffle`` a permutation drawn from ``(seed, e)`` alone). So the prompt tracker's
exactly-once per position is exactly-once per (epoch, row), and a resume that continues the
position continues at the exact row: nothing about the stream is saved but its position.

A row is formatted once per process (cached): the chat template of the tokenizer when asked
(a string prompt becomes one user message), else the text as it is; then tokenized. A prompt
longer than ``max_prompt_len`` tokens keeps its position with ``drop_reason = "too_long"``:
the producer settles it as dropped without generating, so the ledger accounts for every row.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from orchestrator.rollout.data.prompt_files import DatasetIdentity, PromptRow
from orchestrator.rollout.data.tokenizer import HFTokenizer
from orchestrator.rollout.types import Prompt

__all__ = ["TOO_LONG", "DatasetPrompts"]

TOO_LONG = "too_long"
"""Drop reason of a prompt longer than ``max_prompt_len`` tokens."""


class DatasetPrompts:
    """The prompt factory (``make_prompt(index)``) of a data-set task.

    Args:
        rows: the checked rows (:func:`orchestrator.rollout.data.prompt_files.load_prompt_rows`).
        identity: the data set's identity (its row count is the epoch length).
        tokenizer: the run's tokenizer.
        seed: the run seed (the shuffle's).
        shuffle: permute each epoch's rows.
        apply_chat_template: render prompts with the tokenizer's chat template.
        template_kwargs: extra keyword arguments to the template.
        max_prompt_len: longer prompts are dropped as ``too_long``; None = no limit.

    Picklable (the rows and the tokenizer's directory travel; caches do not).
    """

    def __init__(self, rows: Sequence[PromptRow], identity: DatasetIdentity,
                 tokenizer: HFTokenizer, *, seed: int, shuffle: bool,
                 apply_chat_template: bool, template_kwargs: Mapping[str, Any],
                 max_prompt_len: int | None) -> None:
        if not rows:
            raise ValueError("a data set needs at least one row")
        self.rows = tuple(rows)
        self.identity = identity
        self.tokenizer = tokenizer
        self.seed = seed
        self.shuffle = shuffle
        self.apply_chat_template = apply_chat_template
        self.template_kwargs = dict(template_kwargs)
        self.max_prompt_len = max_prompt_len
        self._caches()

    def _caches(self) -> None:
        self._order = lru_cache(maxsize=2)(self._epoch_order)
        self._encoded = lru_cache(maxsize=65536)(self._encode_row)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_order"], state["_encoded"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._caches()

    def __len__(self) -> int:
        return len(self.rows)

    def epoch_row(self, index: int) -> tuple[int, int]:
        """(epoch, row) of stream position ``index`` (row: 0-based over every file in order).

        Raises:
            ValueError: ``index`` is negative.
        """
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        epoch, offset = divmod(index, len(self.rows))
        return epoch, self._order(epoch)[offset]

    def _epoch_order(self, epoch: int) -> tuple[int, ...]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            # A string seed is hashed with SHA-512 by `random`: stable across processes.
            random.Random(f"prompt-data:{self.seed}:{epoch}").shuffle(order)
        return tuple(order)

    def render(self, row: PromptRow) -> str:
        """The prompt text the model reads.

        Raises:
            TokenizerError: the chat template is missing or fails.
        """
        if self.apply_chat_template:
            messages = ([{"role": "user", "content": row.input}] if isinstance(row.input, str)
                        else list(row.input))
            return self.tokenizer.render_chat(messages, self.template_kwargs)
        if isinstance(row.input, str):
            return row.input
        # Messages without a template: their contents, one per line.
        return "\n".join(message["content"] for message in row.input)

    def _encode_row(self, row_index: int) -> tuple[str, tuple[int, ...]]:
        text = self.render(self.rows[row_index])
        return text, tuple(self.tokenizer.encode(text))

    def prompt_length(self, row_index: int) -> int:
        """Tokens of row ``row_index``'s prompt."""
        return len(self._encoded(row_index)[1])

    def longest_kept_prompt(self) -> int:
        """Tokens of the longest prompt not dropped as too long (sizes the model's context).

        Tokenizes every row once (cached), so a bad template fails here, before a run starts.
        """
        lengths = [self.prompt_length(row) for row in range(len(self.rows))]
        kept = [n for n in lengths if self.max_prompt_len is None or n <= self.max_prompt_len]
        return max(kept, default=self.max_prompt_len or max(lengths))

    def make_prompt(self, index: int) -> Prompt:
        """The prompt at stream position ``index`` (deterministic; the prompt's ``index`` is
        ``index``; its metadata is the row's).

        Raises:
            ValueError: ``index`` is negative.
        """
        _, row_index = self.epoch_row(index)
        row = self.rows[row_index]
        text, tokens = self._encoded(row_index)
        too_long = self.max_prompt_len is not None and len(tokens) > self.max_prompt_len
        return Prompt(index=index, tokens=tokens, label=row.label, text=text,
                      metadata=dict(row.metadata),
                      drop_reason=TOO_LONG if too_long else None)
