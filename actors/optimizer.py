"""The cells' optimizer: ``torch.optim.AdamW``, without importing ``torch._dynamo``.

Five methods of ``torch.optim`` (``step``, ``zero_grad``, ``add_param_group``, ``state_dict``,
``load_state_dict``) are wrapped so that ``torch.compile`` skips them, and each wrapper imports
``torch._dynamo`` on its first call: about as much CPU as ``import torch`` itself (1.0-1.8
CPU-s a cell on a 2-core machine), spent before step 1 on cores the start-up already saturates,
for a compiler the cells never use. :class:`EagerAdamW` calls the undecorated methods
(``__wrapped__``, set by ``functools.wraps``) in eager mode: the same update, bit for bit, and
the same state dict.

A torch whose methods carry no ``__wrapped__`` gets the decorated ones back: the import
returns, nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _undecorated(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without torch's ``torch.compile`` wrapper, or ``method`` if it has none."""
    return getattr(method, "__wrapped__", method)


_ADD_PARAM_GROUP = _undecorated(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = _undecorated(torch.optim.Optimizer.zero_grad)
_STATE_DICT = _undecorated(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = _undecorated(torch.optim.Optimizer.load_state_dict)
_ADAMW_STEP = _undecorated(torch.optim.AdamW.step)


class EagerAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` for a process that never compiles: the same arguments, update and
    state dict (a checkpoint of either loads into the other), no ``torch._dynamo`` import."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """See ``torch.optim.Optimizer.add_param_group``."""
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """See ``torch.optim.Optimizer.zero_grad``."""
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """See ``torch.optim.Optimizer.state_dict``."""
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """See ``torch.optim.Optimizer.load_state_dict``."""
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One AdamW update, with autograd as ``torch.optim`` sets it (off unless the
        optimizer was built ``differentiable``)."""
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAMW_STEP(self, closure)
