"""The built-in engine's incremental decode: the key/value cache gives the full forward's
logits at every position, and a restart after a weight change gives the new weights' logits."""

from __future__ import annotations

import torch

from actors.engines.decoding import StepDecoder
from actors.policies.policy import PolicyConfig, build_policy

CONFIG = PolicyConfig(vocab_size=24, max_sequence_length=64)


def _sequence(rows: int = 3, length: int = 40) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (rows, length),
                         generator=torch.Generator().manual_seed(5))


@torch.inference_mode()
def _step_by_step(decoder: StepDecoder, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    return torch.stack([decoder.logits(tokens[:, :end])
                        for end in range(prompt, tokens.shape[1] + 1)], dim=1)


@torch.inference_mode()
def test_cached_decode_matches_the_full_forward_at_every_position():
    model = build_policy("torch", CONFIG, seed=0).eval()
    tokens = _sequence()

    cached = _step_by_step(StepDecoder(model), tokens, prompt=8)

    full = model(tokens)[:, 7:, :].float()
    assert cached.shape == full.shape
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)


@torch.inference_mode()
def test_after_a_weight_change_a_restarted_decoder_uses_the_new_weights_only():
    model = build_policy("torch", CONFIG, seed=0).eval()
    tokens = _sequence()
    decoder = StepDecoder(model)
    _step_by_step(decoder, tokens[:, :20], prompt=8)  # the cache holds the old weights' keys
    model.load_state_dict(build_policy("torch", CONFIG, seed=1).state_dict())

    stale = decoder.logits(tokens[:, :21])
    decoder.restart()
    fresh = decoder.logits(tokens[:, :21])

    expected = model(tokens[:, :21])[:, -1, :].float()
    torch.testing.assert_close(fresh, expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(stale, expected, atol=1e-3)  # why the engine restarts it


@torch.inference_mode()
def test_a_model_without_a_cache_runs_every_position():
    model = build_policy("megatron", CONFIG, seed=0).eval()
    tokens = _sequence(length=12)

    logits = StepDecoder(model).logits(tokens)

    torch.testing.assert_close(logits, model(tokens)[:, -1, :].float())
