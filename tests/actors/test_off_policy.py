"""The off-policy corrections of the GRPO loss: decoupled PPO (AReaL) and TIS (miles).

Real torch policies (``build_policy``), no doubles: at zero staleness every correction is
on-policy GRPO, far off-policy tokens stay bounded, the truncated fraction counts what was
truncated, and each token's weight comes from the log-prob of the weights that produced it.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from actors.grpo import (
    GRPOConfig,
    OffPolicyCorrection,
    TrainBatch,
    behaviour_weights,
    build_train_batch,
    grpo_loss,
    token_log_probs,
)
from actors.policies.policy import PolicyConfig, build_policy
from orchestrator.config import RunConfig
from orchestrator.rollout.types import Sample

POLICY = PolicyConfig(vocab_size=16, num_layers=1, hidden_size=16, num_attention_heads=2,
                      ffn_hidden_size=32, max_sequence_length=12)
P = "off_policy/"


def random_batch(model: torch.nn.Module, seed: int = 0) -> TrainBatch:
    """Eight sequences of 10 tokens, the last 4 the response, with mixed advantages and the
    model's own log-probs as the behaviour's (zero staleness, no mismatch)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, POLICY.vocab_size, (8, 10), generator=generator)
    mask = torch.zeros(8, 9)
    mask[:, 5:] = 1.0
    with torch.no_grad():
        behaviour = token_log_probs(model(tokens), tokens) * mask
    return TrainBatch(tokens=tokens, loss_mask=mask, rollout_log_probs=behaviour,
                      advantages=torch.randn(8, generator=generator),
                      rewards=torch.zeros(8))


def loss_and_gradient(model: torch.nn.Module, batch: TrainBatch, config: GRPOConfig
                      ) -> tuple[float, list[torch.Tensor], dict[str, float]]:
    model.zero_grad(set_to_none=True)
    loss, metrics = grpo_loss(model, batch, config)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], metrics


@pytest.mark.parametrize("correction", ["decoupled", "tis"])
def test_zero_staleness_equals_on_policy_grpo(correction: str) -> None:
    model = build_policy("torch", POLICY, seed=3)
    batch = random_batch(model)

    plain_loss, plain_grad, _ = loss_and_gradient(model, batch, GRPOConfig())
    loss, grad, metrics = loss_and_gradient(
        model, batch, GRPOConfig(off_policy_correction=correction, tis_clip_low=0.5))

    assert loss == plain_loss
    assert all(torch.equal(a, b) for a, b in zip(grad, plain_grad))
    assert any(torch.count_nonzero(g) for g in grad)  # a real gradient, not two zeros
    assert metrics[P + "ratio_max"] == 1.0 and metrics[P + "truncated_fraction"] == 0.0
    assert metrics[P + "behaviour_kl_k3"] == 0.0


def test_decoupled_is_bounded_at_large_ratios() -> None:
    model = build_policy("torch", POLICY, seed=3)
    batch = random_batch(model)
    config = GRPOConfig(off_policy_correction="decoupled", tis_cap=5.0)
    gradients, losses = [], []
    for log_gap in (math.log(1e3), math.log(1e6)):  # behaviour far less likely than now
        stale = TrainBatch(**{**batch.__dict__, "rollout_log_probs":
                              (batch.rollout_log_probs - log_gap) * batch.loss_mask})
        loss, grad, metrics = loss_and_gradient(model, stale, config)
        losses.append(loss)
        gradients.append(grad)
        assert metrics[P + "truncated_fraction"] == 1.0
        assert metrics[P + "ratio_p50"] == pytest.approx(math.exp(log_gap), rel=1e-3)

    # Each token adds at most tis_cap * |advantage|: the mean is bounded by the largest one.
    assert abs(losses[0]) <= 5.0 * batch.advantages.abs().max().item() + 1e-6
    # Past the cap the ratio no longer matters: a million is treated as a thousand.
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(*gradients))
    assert all(torch.isfinite(g).all() for g in gradients[1])


def test_decoupled_trains_stale_tokens_the_behaviour_clip_ignores() -> None:
    # Ratio 8 to the behaviour, positive advantage: none's PPO clip gives no gradient at all,
    # decoupled clips against the proximal policy (ratio 1) and weighs the token by 5.
    model = build_policy("torch", POLICY, seed=3)
    batch = random_batch(model)
    batch = TrainBatch(**{**batch.__dict__, "advantages": batch.advantages.abs(),
                          "rollout_log_probs": (batch.rollout_log_probs - math.log(8.0))
                          * batch.loss_mask})

    _, none_grad, _ = loss_and_gradient(model, batch, GRPOConfig(dual_clip=None))
    _, decoupled_grad, _ = loss_and_gradient(
        model, batch, GRPOConfig(off_policy_correction="decoupled", tis_cap=5.0))

    assert all(torch.count_nonzero(g) == 0 for g in none_grad)
    assert any(torch.count_nonzero(g) for g in decoupled_grad)


def test_truncated_fraction_and_quantiles_count_the_tokens() -> None:
    weights = torch.tensor([[0.5, 1.0, 3.0, 8.0, 20.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])  # the last is not a response token
    proximal = torch.zeros(1, 6)
    behaviour = -torch.log(weights)

    decoupled, metrics = behaviour_weights(proximal, behaviour, mask,
                                           GRPOConfig(off_policy_correction="decoupled"))
    tis, tis_metrics = behaviour_weights(
        proximal, behaviour, mask, GRPOConfig(off_policy_correction="tis", tis_clip_low=0.6))
    none, none_metrics = behaviour_weights(proximal, behaviour, mask, GRPOConfig())

    assert decoupled[0, :5].tolist() == pytest.approx([0.5, 1.0, 3.0, 5.0, 5.0])
    assert metrics[P + "truncated_fraction"] == pytest.approx(2 / 5)
    assert tis[0, :5].tolist() == pytest.approx([0.6, 1.0, 3.0, 5.0, 5.0])
    assert tis_metrics[P + "truncated_fraction"] == pytest.approx(3 / 5)
    assert none is None and none_metrics[P + "truncated_fraction"] == 0.0
    assert metrics[P + "ratio_p50"] == pytest.approx(3.0)
    assert metrics[P + "ratio_max"] == pytest.approx(20.0)
    k3 = sum((w - 1.0) - math.log(w) for w in (0.5, 1.0, 3.0, 8.0, 20.0)) / 5
    assert metrics[P + "behaviour_kl_k3"] == pytest.approx(k3, rel=1e-5)


def test_each_token_is_weighted_by_the_version_that_produced_it() -> None:
    # A sample that spans a weight swap: its first two response tokens came from version 0,
    # the last two from version 1; the trainer now holds version 2.
    versions = [build_policy("torch", POLICY, seed=s) for s in (10, 11, 12)]
    prompt, response = [1, 2, 3, 4], [5, 6, 7, 8]
    tokens = torch.tensor([prompt + response])
    with torch.no_grad():
        per_version = [token_log_probs(m(tokens), tokens)[0, 3:7] for m in versions]
    token_versions = [0, 0, 1, 1]
    behaviour = [float(per_version[v][i]) for i, v in enumerate(token_versions)]
    samples = [Sample(index=i, group_index=0, prompt_tokens=prompt, response_tokens=response,
                      rollout_log_probs=behaviour, reward=float(i), weight_versions=[0, 1],
                      token_versions=token_versions) for i in range(2)]
    batch = build_train_batch([samples], pad_id=0)

    with torch.no_grad():
        proximal = token_log_probs(versions[2](batch.tokens), batch.tokens)
    weight, _ = behaviour_weights(proximal, batch.rollout_log_probs, batch.loss_mask,
                                  GRPOConfig(off_policy_correction="decoupled", tis_cap=1e9))

    expected = torch.exp(per_version[2] - torch.stack(
        [per_version[v][i] for i, v in enumerate(token_versions)]))
    assert torch.allclose(weight[0, 3:7], expected, rtol=1e-5)
    assert weight[0, :3].tolist() == [1.0, 1.0, 1.0]  # prompt positions: neutral, masked out


def test_decoupled_clips_against_the_proximal_policy_when_given() -> None:
    # Several optimizer steps per batch: the proximal log-probs were taken before the first.
    model = build_policy("torch", POLICY, seed=3)
    batch = random_batch(model)
    proximal = (batch.rollout_log_probs - 1.0) * batch.loss_mask  # the model moved since
    with_proximal = TrainBatch(**{**batch.__dict__, "proximal_log_probs": proximal,
                                  "advantages": batch.advantages.abs()})

    loss, metrics = grpo_loss(model, with_proximal,
                              GRPOConfig(off_policy_correction="decoupled", tis_cap=5.0))

    # ratio to proximal e > 1.28, positive advantages: every token clipped, weight e^-1.
    assert metrics["clip_fraction"] == 1.0
    expected = -(1.28 * math.exp(-1.0)) * with_proximal.advantages.mean().item()
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_bad_bounds_and_names_are_refused() -> None:
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOConfig(off_policy_correction="tis", tis_cap=0.5)
    with pytest.raises(ValueError):
        GRPOConfig(off_policy_correction="icepop")
    with pytest.raises(ValidationError, match="off_policy_correction"):
        RunConfig(off_policy_correction="icepop")
    assert GRPOConfig(off_policy_correction="tis").off_policy_correction is OffPolicyCorrection.TIS
