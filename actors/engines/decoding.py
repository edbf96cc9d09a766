"""Incremental decoding for the built-in engine: last-position logits of a batch of growing
sequences, computed from a key/value cache instead of re-running every position per token.

Without a cache a decode step costs the whole sequence, so tokens/s fell to 4% of its
8-token rate at 512 (bench/response_length.py). A cache is only valid for the weights that
built it: the engine calls :meth:`StepDecoder.restart` whenever a call has been parked, since
weights change only while every call is parked, and the next step prefills the whole sequence
under the new weights (a response token's log-prob is always that of the weights that
produced it, as with a full forward). Models without a cache (the megatron ``GPTModel``) run
every position each step, as before.
"""

from __future__ import annotations

import torch
from torch import nn

from actors.policies.policy import DecodeCache, TorchCausalLM

__all__ = ["StepDecoder"]


class StepDecoder:
    """One generate call's decoder over ``model`` (not shared between calls or threads)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._cache: DecodeCache | None = None
        self._cached = isinstance(model, TorchCausalLM)

    def restart(self) -> None:
        """Forget the cache: the next step prefills (call after the weights may have changed)."""
        self._cache = None

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The last position's logits ``[rows, vocab]`` (float32) for ``tokens [rows, seq]``,
        where ``tokens`` is the previous call's sequence plus one new position (or anything,
        right after :meth:`restart`)."""
        if not self._cached:
            return self.model(tokens)[:, -1, :].float()
        assert isinstance(self.model, TorchCausalLM)
        if self._cache is None or self._cache.length != tokens.shape[1] - 1:
            self._cache = self.model.new_cache()
            return self.model(tokens, self._cache)[:, -1, :].float()
        return self.model(tokens[:, -1:], self._cache)[:, -1, :].float()
