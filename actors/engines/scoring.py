"""The rewards of one finished group, as both engines compute them (one rule, one home).

Aborted samples are not scored (reward 0; the group is regenerated anyway). The others are
scored in one ``task.score_group`` call. A reward function that raises does not crash the
engine and never silently becomes 0: every scored sample of the group gets the error as its
``reward_error`` and the rollout screen drops the group as ``reward_error``.

An engine loads its task (:func:`load_task`) when it is made, not on its first request: a
data set's tokenizer loads Hugging Face ``transformers`` (seconds of imports), which then
runs once, on the actor's start-up thread, instead of on one of the first batch's request
threads while the others wait for it; and a tokenizer that cannot load fails the engine's
start instead of its first group.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from orchestrator.rollout.types import Prompt, SampleStatus

__all__ = ["load_task", "score_group"]

logger = logging.getLogger(__name__)


def load_task(task: Any) -> Any:
    """``task`` with its tokenizer loaded (its EOS and pad ids read), ready to stop and score
    generations; returns it.

    Raises:
        TokenizerError: a data set's tokenizer cannot be loaded.
    """
    _ = task.tokenizer.eos_id, task.tokenizer.pad_id
    return task


def score_group(task: Any, prompt: Prompt, responses: Sequence[Sequence[int]],
                statuses: Sequence[SampleStatus]) -> tuple[list[float], str | None]:
    """(reward per sample, the reward error or None).

    ``task`` has ``score_group(prompt, responses) -> list[float]``. Never raises for a failing
    reward function: its error comes back as one line.
    """
    scored = [row for row, status in enumerate(statuses) if status is not SampleStatus.ABORTED]
    rewards = [0.0] * len(responses)
    if not scored:
        return rewards, None
    try:
        values = task.score_group(prompt, [responses[row] for row in scored])
        if len(values) != len(scored):
            raise TypeError(f"score_group returned {len(values)} rewards for {len(scored)}")
    except Exception as exc:  # a user's reward function: anything it raises is its error
        error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        logger.warning("prompt %d: reward function raised, group dropped: %s", prompt.index,
                       error)
        return rewards, error
    for row, value in zip(scored, values):
        rewards[row] = float(value)
    return rewards, None
