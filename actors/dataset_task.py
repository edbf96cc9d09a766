"""DatasetTask: the engines' side of a data-set task (``--prompt-data``): tokenizer and reward.

The prompts themselves are made by the rollout manager
(:class:`orchestrator.rollout.data.prompt_stream.DatasetPrompts`); an engine only needs to stop at
the tokenizer's EOS and score a finished group. :meth:`DatasetTask.score_group` decodes each
response (up to EOS, special tokens skipped) and calls the run's reward function with the
prompt's text, label and metadata. Rewards are computed here, where generation finishes, off
the trainer's path.

Picklable and small: the tokenizer travels as its directory, the reward as its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors.rewards import RewardFunction
from orchestrator.rollout.data.tokenizer import HFTokenizer
from orchestrator.rollout.types import Prompt

__all__ = ["DatasetTask"]


@dataclass
class DatasetTask:
    """Tokenizer and reward function of a data-set task."""

    tokenizer: HFTokenizer
    reward_function: RewardFunction

    def score_group(self, prompt: Prompt, responses: Sequence[Sequence[int]]) -> list[float]:
        """One reward per response (token ids, EOS included if generated).

        Raises:
            Whatever the reward function raises (the engine records it as the group's
            ``reward_error``; the rollout screen drops the group).
        """
        texts = [self.tokenizer.decode(response) for response in responses]
        count = len(texts)
        return self.reward_function.score([prompt.text] * count, texts, [prompt.label] * count,
                                          [prompt.metadata] * count)
