"""One decode step of the built-in engine, its tensor side: last-position logits of a batch of
growing sequences, computed from a key/value cache instead of re-running every position per
token (:class:`StepDecoder`), and the next token drawn from them (:func:`sample_next`, greedy or
from the nucleus of :func:`top_p_filter`).

Without a cache a decode step costs the whole sequence, so tokens/s fell to 4% of its
8-token rate at 512 (bench/response_length.py). A cache is only valid for the weights that
built it: the engine calls :meth:`StepDecoder.restart` whenever a call has been parked, since
weights change only while every call is parked, and the next step prefills the whole sequence
under the new weights (a response token's log-prob is always that of the weights that
produced it, as with a full forward). Models without a cache (the megatron ``GPTModel``) run
every position each step, as before.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from actors.engines.sampling import SamplingParams
from actors.policies.policy import DecodeCache, TorchCausalLM

__all__ = ["StepDecoder", "sample_next", "top_p_filter"]


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


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches ``top_p``."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass before it is below top_p (so the top token is always kept).
    keep_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                rng_lock: threading.Lock) -> tuple[torch.Tensor, list[float]]:
    """One decode step's tokens from the last position's ``logits [rows, vocab]`` (greedy at
    temperature 0, else from the nucleus), and each chosen token's unfiltered
    ``log_softmax(logits / temperature)``. ``generator`` is drawn under ``rng_lock``."""
    step_log_probs = torch.log_softmax(logits / (params.temperature or 1.0), dim=-1)
    if params.temperature == 0:
        next_tokens = logits.argmax(dim=-1)
    else:
        probs = top_p_filter(step_log_probs.exp(), params.top_p)
        with rng_lock:
            next_tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return next_tokens, step_log_probs.gather(-1, next_tokens[:, None])[:, 0].tolist()
