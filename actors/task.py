"""The verifiable toy task: add two small numbers, answer with the exact sum.

A prompt is ``"3+4="`` and the correct response is ``"7"`` followed by end-of-sequence. The
reward is exact (1.0 for the right number then EOS), with partial credit for a well-formed wrong
answer (digits then EOS): a small format credit plus a closeness credit that shrinks with the
distance to the sum. Why the closeness term: with format credit alone, a tiny model learns the
format, collapses onto the most frequent sum for every prompt, and its groups stop carrying any
prompt-specific signal (measured: exact-match stalls near the 20% of "always 4"); graded credit
keeps wrong answers in a group distinguishable, so advantages point towards each prompt's own
answer. Nothing is downloaded: the tokenizer is a fixed list of
symbols and prompts are generated from ``(seed, index)``.

Difficulty is a knob (``max_operand``): with operands 0..4 the sums are single digits and a
two-layer model learns the table within a few dozen GRPO steps on CPU.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.rollout.types import Prompt

__all__ = ["AdditionTask", "Tokenizer", "TOKENIZER"]

_SYMBOLS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    *(str(digit) for digit in range(10)),
    "+",
    "-",
    "*",
    "=",
    " ",
)


class Tokenizer:
    """A character tokenizer over a fixed list of a few dozen symbols.

    Ids are positions in the symbol list, so they are stable across processes and versions of
    this module as long as the list only grows at its end.
    """

    def __init__(self, symbols: Sequence[str] = _SYMBOLS) -> None:
        self.symbols: tuple[str, ...] = tuple(symbols)
        self._ids = {symbol: token_id for token_id, symbol in enumerate(self.symbols)}
        self.pad_id = self._ids["<pad>"]
        self.eos_id = self._ids["<eos>"]
        self.bos_id = self._ids["<bos>"]

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, one per character.

        Raises:
            ValueError: a character is not in the vocabulary.
        """
        try:
            return [self._ids[character] for character in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, token_ids: Sequence[int], stop_at_eos: bool = True) -> str:
        """Text of ``token_ids``; special tokens are dropped, decoding stops at the first EOS.

        Ids outside the vocabulary decode to ``"?"`` (a sampler over a padded vocabulary may
        produce them; they are never correct).
        """
        characters: list[str] = []
        for token_id in token_ids:
            if stop_at_eos and token_id == self.eos_id:
                break
            if token_id in (self.pad_id, self.eos_id, self.bos_id):
                continue
            characters.append(self.symbols[token_id] if 0 <= token_id < self.vocab_size else "?")
        return "".join(characters)


TOKENIZER = Tokenizer()


@dataclass(frozen=True)
class AdditionTask:
    """Two operands in ``0..max_operand``; the response must be their sum then EOS.

    Attributes:
        seed: selects the prompt sequence; ``make_prompt(i)`` depends only on (seed, i).
        max_operand: largest operand (inclusive); 4 keeps every sum a single digit.
        format_credit: reward for a well-formed but wrong answer (digits then EOS).
        closeness_credit: added to ``format_credit`` for a wrong answer, scaled by
            ``1 - distance / closeness_window`` (never below 0).
        closeness_window: distance to the sum at which the closeness credit reaches 0.
    """

    seed: int = 0
    max_operand: int = 4
    format_credit: float = 0.1
    closeness_credit: float = 0.4
    closeness_window: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.max_operand <= 9:
            raise ValueError(f"max_operand must be in 0..9, got {self.max_operand}")
        if self.format_credit < 0 or self.closeness_credit < 0 or self.closeness_window < 1:
            raise ValueError(f"credits must be >= 0 and the window >= 1: {self}")
        if self.format_credit + self.closeness_credit >= 1.0:
            raise ValueError("a wrong answer must earn less than an exact one (1.0)")

    @property
    def tokenizer(self) -> Tokenizer:
        return TOKENIZER

    def operands(self, index: int) -> tuple[int, int]:
        """The two operands of prompt ``index`` (deterministic per (seed, index))."""
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        # A string seed is hashed with SHA-512 by `random`, so this is stable across processes
        # and Python runs (unlike hash() of a tuple under hash randomisation).
        rng = random.Random(f"addition:{self.seed}:{index}")
        return rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)

    def make_prompt(self, index: int) -> Prompt:
        """Prompt number ``index`` of this task's seeded source.

        Raises:
            ValueError: ``index`` is negative.
        """
        left, right = self.operands(index)
        return Prompt(
            index=index,
            tokens=tuple(TOKENIZER.encode(f"{left}+{right}=")),
            label=str(left + right),
        )

    def score_group(self, prompt: Prompt, responses: Sequence[Sequence[int]]) -> list[float]:
        """:meth:`reward` of each response (the engines' call, one per finished group)."""
        return [self.reward(prompt, response) for response in responses]

    def reward(self, prompt: Prompt, response_tokens: Sequence[int]) -> float:
        """1.0 for exactly the sum then EOS; partial credit (< 1) for other digits then EOS;
        0.0 for anything else.

        A response without EOS (truncated) earns nothing, so the model must learn to stop.
        """
        tokens = list(response_tokens)
        if TOKENIZER.eos_id not in tokens:
            return 0.0
        answer_tokens = tokens[: tokens.index(TOKENIZER.eos_id)]
        if not answer_tokens:
            return 0.0
        text = TOKENIZER.decode(answer_tokens, stop_at_eos=False)
        if len(text) != len(answer_tokens) or not text.isdigit():
            return 0.0
        if text == prompt.label:
            return 1.0
        distance = abs(int(text) - int(prompt.label))
        closeness = max(0.0, 1.0 - distance / self.closeness_window)
        return self.format_credit + self.closeness_credit * closeness
