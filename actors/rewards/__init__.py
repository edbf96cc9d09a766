"""Rewards of data-set tasks: the built-ins (``--rm-type``) and your own (``--custom-rm-path``).

* ``builtin``: ``exact`` (normalised string match), ``math`` (math-verify), ``boxed`` (the
  boxed answer, matched with math-verify).
* ``custom``: load ``module.function`` / ``module:function``, sync or async, per sample
  ``f(prompt, response, label, metadata) -> float``, or batched (``f.batched = True``, called
  with lists, returning a list).

:func:`reward_function` builds the one a run uses from its options. Each returns a float per
sample; one that raises makes its group a ``reward_error`` drop (the engine records it on the
sample; the rollout screen drops the group), never a silent 0.
"""

from actors.rewards.builtin import BUILTIN_REWARDS
from actors.rewards.custom import RewardFunction, RewardLoadError, reward_function

__all__ = ["BUILTIN_REWARDS", "RewardFunction", "RewardLoadError", "reward_function"]
