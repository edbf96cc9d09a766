"""The policy: both backends build the same deterministic causal LM; LoRA freezes the base."""

from __future__ import annotations

import pytest
import torch

from actors.policies.policy import (
    PolicyConfig,
    PolicyError,
    adapter_state_dict,
    build_policy,
    load_tensors,
    tensor_state_dict,
)
from actors.task import TOKENIZER

BACKENDS = ["torch", "megatron"]
CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)


def _tokens(batch: int = 4, length: int = 8, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, CONFIG.vocab_size, (batch, length), generator=generator)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_builds_same_weights(backend: str) -> None:
    first = tensor_state_dict(build_policy(backend, CONFIG, seed=5))
    again = tensor_state_dict(build_policy(backend, CONFIG, seed=5))
    other = tensor_state_dict(build_policy(backend, CONFIG, seed=6))

    assert first.keys() == again.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_are_causal(backend: str) -> None:
    model = build_policy(backend, CONFIG, seed=0).eval()
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % CONFIG.vocab_size

    with torch.no_grad():
        logits, logits_changed = model(tokens), model(changed)

    assert logits.shape == (4, 8, CONFIG.vocab_size)
    torch.testing.assert_close(logits[:, :-1], logits_changed[:, :-1])
    assert not torch.allclose(logits[:, -1], logits_changed[:, -1])


def test_twin_computes_the_same_function_as_megatron() -> None:
    megatron = build_policy("megatron", CONFIG, seed=1).eval()
    twin = build_policy("torch", CONFIG, seed=2).eval()

    assert tensor_state_dict(megatron).keys() == tensor_state_dict(twin).keys()
    load_tensors(twin, tensor_state_dict(megatron), adapters_only=False)
    with torch.no_grad():
        torch.testing.assert_close(twin(_tokens()), megatron(_tokens()), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plain_torch_optimizer_step_lowers_the_loss(backend: str) -> None:
    model = build_policy(backend, CONFIG, seed=0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = _tokens(batch=8)

    def loss() -> torch.Tensor:
        logits = model(tokens)[:, :-1]
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, CONFIG.vocab_size), tokens[:, 1:].reshape(-1)
        )

    before = loss()
    for _ in range(5):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()

    assert loss().item() < before.item() - 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_lora_freezes_the_base_and_starts_as_a_no_op(backend: str) -> None:
    base = build_policy(backend, CONFIG, seed=0).eval()
    lora = build_policy(backend, PolicyConfig(vocab_size=CONFIG.vocab_size, lora_rank=4), seed=0)

    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    adapters = adapter_state_dict(lora)

    assert trainable == set(adapters)
    # a, b on qkv, proj, fc1, fc2 of every layer and on the output layer
    assert len(adapters) == 2 * (4 * CONFIG.num_layers + 1)
    assert any(name.startswith("output_layer.") for name in adapters)
    with torch.no_grad():
        torch.testing.assert_close(lora.eval()(_tokens()), base(_tokens()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_tensors_checks_everything_before_copying(backend: str) -> None:
    model = build_policy(backend, CONFIG, seed=0)
    before = {name: t.clone() for name, t in tensor_state_dict(model).items()}
    weights = {name: t + 1.0 for name, t in before.items()}
    name = next(iter(weights))

    with pytest.raises(PolicyError):
        load_tensors(model, {**weights, "extra.weight": torch.zeros(1)}, adapters_only=False)
    with pytest.raises(PolicyError):
        load_tensors(model, {k: v for k, v in weights.items() if k != name}, adapters_only=False)
    with pytest.raises(PolicyError):
        load_tensors(model, {**weights, name: torch.zeros(3, 3, 3)}, adapters_only=False)
    with pytest.raises(PolicyError):
        adapter_state_dict(model)

    after = tensor_state_dict(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unknown_backend_and_bad_config_are_refused() -> None:
    with pytest.raises(PolicyError):
        build_policy("jax", CONFIG)
    with pytest.raises(ValueError):
        PolicyConfig(hidden_size=65, num_attention_heads=4)
    with pytest.raises(ValueError):
        PolicyConfig.from_value({"hidden": 3})
