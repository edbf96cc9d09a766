"""The built-in rewards of ``--rm-type``: 1.0 for a correct answer, else 0.0.

``math`` and ``boxed`` use Hugging Face ``math-verify`` (what verl and open-r1 use) for both
extraction and equivalence; nothing here parses LaTeX. They run with math-verify's signal-based
timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``): engines call rewards from
worker threads, where ``signal.alarm`` is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BUILTIN_REWARDS", "boxed_reward", "exact_reward", "math_reward", "normalise"]

_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, whitespace collapsed, ends stripped of spaces and a final period."""
    return _SPACES.sub(" ", text).strip().rstrip(".").strip().lower()


def exact_reward(prompt: str, response: str, label: str, metadata: Mapping[str, Any]) -> float:
    """1.0 when the normalised response equals the normalised label."""
    return 1.0 if normalise(response) == normalise(label) else 0.0


def _verify(label: str, response: str, answer_config: list[Any]) -> float:
    from math_verify import parse, verify

    gold = parse(label, parsing_timeout=None)
    answer = parse(response, extraction_config=answer_config, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0


def math_reward(prompt: str, response: str, label: str, metadata: Mapping[str, Any]) -> float:
    """1.0 when math-verify finds the response's answer equivalent to the label."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return _verify(label, response, [LatexExtractionConfig(), ExprExtractionConfig()])


def boxed_reward(prompt: str, response: str, label: str, metadata: Mapping[str, Any]) -> float:
    """1.0 when the response's ``\\boxed{}`` answer (or an anchored "final answer is") is
    equivalent to the label, per math-verify; a bare number elsewhere does not count."""
    from math_verify import LatexExtractionConfig

    config = LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=0)
    return _verify(label, response, [config])


BUILTIN_REWARDS: dict[str, Callable[[str, str, str, Mapping[str, Any]], float]] = {
    "exact": exact_reward,
    "math": math_reward,
    "boxed": boxed_reward,
}
"""``--rm-type`` name -> reward function."""
