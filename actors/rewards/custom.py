"""Your own reward: ``--custom-rm-path module.function`` (or ``module:function``).

The function is imported where rewards are computed (the engines, off the trainer's path) and
called once per sample as ``f(prompt, response, label, metadata) -> float``; an ``async def``
is awaited. A function with ``batched = True`` is called once per group with lists
(``f(prompts, responses, labels, metadatas) -> list[float]``). The module must be importable
on every node (on ``PYTHONPATH``, or installed).

:class:`RewardFunction` is what engines hold: picklable (it travels by name and is imported
again in each process), called with a group's samples at once.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.errors import RewardLoadError
from actors.rewards.builtin import BUILTIN_REWARDS

__all__ = ["RewardFunction", "RewardLoadError", "reward_function"]


def _import(path: str) -> Callable[..., Any]:
    if ":" in path:
        module_name, _, name = path.partition(":")
    else:
        module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError or whatever the module raises at import
        raise RewardLoadError(f"custom_rm_path: cannot import {module_name!r}: "
                              f"{type(exc).__name__}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise RewardLoadError(f"custom_rm_path: {module_name!r} has no function {name!r}")
    return function


class RewardFunction:
    """The run's reward: a built-in (``rm_type``) or ``custom_rm_path``.

    Raises:
        RewardLoadError: (on construction) unknown built-in or an unimportable function.
    """

    def __init__(self, rm_type: str = "math", custom_rm_path: str | None = None) -> None:
        if custom_rm_path is None and rm_type not in BUILTIN_REWARDS:
            raise RewardLoadError(f"rm_type: unknown built-in reward {rm_type!r}")
        self.rm_type = rm_type
        self.custom_rm_path = custom_rm_path
        self._function = self._resolve()

    def _resolve(self) -> Callable[..., Any]:
        if self.custom_rm_path is None:
            return BUILTIN_REWARDS[self.rm_type]
        return _import(self.custom_rm_path)

    def __getstate__(self) -> dict[str, Any]:
        return {"rm_type": self.rm_type, "custom_rm_path": self.custom_rm_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.rm_type, self.custom_rm_path = state["rm_type"], state["custom_rm_path"]
        self._function = self._resolve()

    @property
    def name(self) -> str:
        return self.custom_rm_path or self.rm_type

    def score(self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[str],
              metadatas: Sequence[Mapping[str, Any]]) -> list[float]:
        """One float per sample.

        Raises:
            Whatever the function raises; ``TypeError`` for a result that is not a finite
            number (or, batched, not one per sample). The caller drops the group.
        """
        function = self._function
        if getattr(function, "batched", False):
            results = list(_run(function(list(prompts), list(responses), list(labels),
                                         list(metadatas))))
            if len(results) != len(responses):
                raise TypeError(f"batched reward returned {len(results)} values for "
                                f"{len(responses)} samples")
        else:
            results = [_run(function(*args))
                       for args in zip(prompts, responses, labels, metadatas)]
        return [_check(value) for value in results]


def _run(result: Any) -> Any:
    # An async reward is awaited on a loop of its own: engines call rewards from threads.
    if not inspect.isawaitable(result):
        return result

    async def wait() -> Any:
        return await result

    return asyncio.run(wait())


def _check(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"a reward must be a finite number, got {value!r}")
    return float(value)


def reward_function(rm_type: str, custom_rm_path: str | None) -> RewardFunction:
    """The run's reward function, checked now (import errors fail before a run starts).

    Raises:
        RewardLoadError: one line.
    """
    return RewardFunction(rm_type, custom_rm_path)
