"""The GRPO objective: group advantages, the PPO clip and the dual clip on one token."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from actors.grpo import GRPOConfig, TrainBatch, grpo_loss, group_advantages


class FixedLogits(nn.Module):
    """A "model" whose next-token logits are one trainable vector at every position."""

    def __init__(self, log_prob_of_token_1: float) -> None:
        super().__init__()
        # Two tokens: p(1) = exp(log_prob_of_token_1), the rest on token 0.
        p1 = math.exp(log_prob_of_token_1)
        self.logits = nn.Parameter(torch.tensor([math.log(1.0 - p1), math.log(p1)]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(tokens.shape[0], tokens.shape[1], 2)


def one_token_batch(rollout_log_prob: float, advantage: float) -> TrainBatch:
    """One sequence ``[0, 1]``: the response is token 1, sampled with ``rollout_log_prob``."""
    return TrainBatch(
        tokens=torch.tensor([[0, 1]]),
        loss_mask=torch.ones(1, 1),
        rollout_log_probs=torch.tensor([[rollout_log_prob]]),
        advantages=torch.tensor([advantage]),
        rewards=torch.tensor([0.0]),
    )


def test_group_advantages_are_normalised_within_the_group() -> None:
    assert group_advantages([1.0, 0.0]) == pytest.approx([1.0, -1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0]) == [0.0]


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_on_policy_token_has_ratio_one_and_loss_minus_advantage(advantage: float) -> None:
    model = FixedLogits(math.log(0.5))
    loss, metrics = grpo_loss(model, one_token_batch(math.log(0.5), advantage), GRPOConfig())

    assert loss.item() == pytest.approx(-advantage, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clip_fraction"] == 0.0 and metrics["dual_clip_fraction"] == 0.0


def test_dual_clip_bounds_a_far_off_policy_token_with_a_negative_advantage() -> None:
    # The trainer gives the token 0.8, the engine sampled it at 0.05: ratio 16.
    model = FixedLogits(math.log(0.8))
    batch = one_token_batch(math.log(0.05), advantage=-1.0)

    plain, plain_metrics = grpo_loss(model, batch, GRPOConfig(dual_clip=None))
    bounded, metrics = grpo_loss(model, batch, GRPOConfig(dual_clip=3.0))

    assert plain_metrics["ratio_max"] == pytest.approx(16.0, rel=1e-4)
    assert plain.item() == pytest.approx(16.0, rel=1e-4)  # -(ratio * advantage)
    assert bounded.item() == pytest.approx(3.0, rel=1e-6)  # -(dual_clip * advantage)
    assert metrics["dual_clip_fraction"] == 1.0
    bounded.backward()
    assert torch.count_nonzero(model.logits.grad) == 0  # the bound is a constant: no push


def test_dual_clip_leaves_positive_advantages_to_the_ppo_clip() -> None:
    model = FixedLogits(math.log(0.8))
    batch = one_token_batch(math.log(0.05), advantage=1.0)

    loss, metrics = grpo_loss(model, batch, GRPOConfig(dual_clip=3.0))

    assert loss.item() == pytest.approx(-1.28, rel=1e-6)  # ratio clipped to 1 + clip_high
    assert metrics["clip_fraction"] == 1.0 and metrics["dual_clip_fraction"] == 0.0
