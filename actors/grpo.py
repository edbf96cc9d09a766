"""The GRPO objective: group-normalised advantages and a clipped importance ratio.

Samples come from rollout engines that may run older weights than the trainer (fully async).
Each response token carries the log-probability the engine sampled it with; the loss weights
the token's advantage by ``ratio = exp(logp_now - logp_rollout)`` clipped PPO-style to
``[1 - clip_low, 1 + clip_high]``, so off-policy samples are corrected and cannot move the
policy far in one step. For a negative advantage the PPO minimum does not bound the ratio;
the dual clip (Ye et al. 2020, verl's ``clip_ratio_c``) does: such a token contributes at most
``dual_clip * |advantage|``, so one far off-policy token cannot dominate a step (fully-async
runs here see ratios above 10 on stale tokens). The loss is the mean over all response tokens
of the batch.

Log-probs on both sides are ``log_softmax(logits / temperature)`` of the chosen token (top-p
filtering is ignored, as is usual: the engine records the unfiltered value).

With partial rollout a response's tokens may come from several weight versions (a weight update
paused the engine mid-response); each token's rollout log-prob is the one of the weights that
produced it (``Sample.token_versions`` names them), so the ratio is exact per token and nothing
here depends on how many versions a sample spans.

Off-policy correction (``GRPOConfig.off_policy_correction``, :class:`OffPolicyCorrection`):

- ``none``: the above; the PPO ratio is taken against the behaviour policy (the engine's
  log-probs). A stale token whose ratio left the clip range gets no gradient at all.
- ``decoupled``: AReaL's decoupled PPO (Fu et al. 2025). The PPO ratio is taken against the
  *proximal* policy, the trainer's weights at the start of the step, and the behaviour
  importance weight ``w = pi_prox / pi_behav`` multiplies the clipped objective as a constant,
  truncated to ``min(w, tis_cap)``. The trainer takes one optimizer step per batch, so the
  proximal log-probs are this forward pass's own, detached (exact, no extra forward pass); a
  batch that carries ``proximal_log_probs`` (several optimizer steps per batch) uses those.
- ``tis``: miles' ``--use-tis`` (truncated importance sampling): the same decoupled form (in
  miles the PPO ratio is against the trainer's own log-probs at the start of the step, which
  is the proximal policy here), with ``w`` clamped into ``[tis_clip_low, tis_cap]``.

With behaviour == proximal (no staleness, no engine/trainer mismatch) ``w`` is 1 and the ratio
is the same in every mode, so all three give the same loss and gradient. Metrics (prefix
``off_policy/``): quantiles of ``w``, the fraction of tokens whose ``w`` was truncated, and the
k3 estimate of KL(behaviour || proximal), ``E[(w - 1) - log w]`` over response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
import enum
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.rollout.types import Sample, SampleStatus

__all__ = ["GRPOConfig", "OffPolicyCorrection", "TrainBatch", "behaviour_weights",
           "build_train_batch", "grpo_loss", "group_advantages", "token_log_probs"]

OFF_POLICY_PREFIX = "off_policy/"


class OffPolicyCorrection(enum.StrEnum):
    """How the loss corrects for tokens sampled by older weights (module docstring)."""

    NONE = "none"
    DECOUPLED = "decoupled"
    TIS = "tis"


@dataclass(frozen=True)
class GRPOConfig:
    """Knobs of the objective. ``temperature`` must equal the engines' sampling temperature;
    ``dual_clip`` None turns the dual clip off. ``tis_cap`` bounds the behaviour importance
    weight from above (``decoupled`` and ``tis``), ``tis_clip_low`` from below (``tis`` only).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    temperature: float = 1.0
    advantage_eps: float = 1e-6
    off_policy_correction: OffPolicyCorrection = OffPolicyCorrection.NONE
    tis_cap: float = 5.0
    tis_clip_low: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "off_policy_correction",
                           OffPolicyCorrection(self.off_policy_correction))
        if not 0.0 <= self.tis_clip_low <= 1.0 <= self.tis_cap:
            raise ValueError(f"need 0 <= tis_clip_low <= 1 <= tis_cap, got "
                             f"{self.tis_clip_low}, {self.tis_cap}")


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """``(r - mean) / (std + eps)`` within one group; all zeros when every reward is equal."""
    values = torch.tensor(list(rewards), dtype=torch.float64)
    if values.numel() < 2:
        return [0.0] * values.numel()
    centred = values - values.mean()
    return (centred / (values.std(unbiased=False) + eps)).tolist()


@dataclass
class TrainBatch:
    """Padded tensors of one training batch (n sequences of length L).

    ``loss_mask[i, t]`` is 1 where token ``t + 1`` of sequence ``i`` is a response token;
    ``rollout_log_probs`` (the behaviour policy's, per token) is aligned with it, and so is
    ``proximal_log_probs`` when given (None: this step's own forward pass, detached).
    """

    tokens: torch.Tensor  # [n, L] long
    loss_mask: torch.Tensor  # [n, L-1] float
    rollout_log_probs: torch.Tensor  # [n, L-1] float
    advantages: torch.Tensor  # [n] float
    rewards: torch.Tensor  # [n] float
    skipped_samples: int = 0
    proximal_log_probs: torch.Tensor | None = None  # [n, L-1] float

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device) -> TrainBatch:
        """This batch with its tensors on ``device`` (itself when they are there already)."""
        if self.tokens.device == device:
            return self
        proximal = self.proximal_log_probs
        return replace(self, tokens=self.tokens.to(device), loss_mask=self.loss_mask.to(device),
                       rollout_log_probs=self.rollout_log_probs.to(device),
                       advantages=self.advantages.to(device), rewards=self.rewards.to(device),
                       proximal_log_probs=None if proximal is None else proximal.to(device))


def build_train_batch(groups: Sequence[Sequence[Sample]], pad_id: int,
                      eps: float = 1e-6) -> TrainBatch:
    """Tensorise groups of samples; advantages are normalised within each group.

    ABORTED samples and samples without response tokens are skipped (counted in
    ``skipped_samples``); the rollout path should not deliver them, but a batch with some is
    still trainable.

    Raises:
        ValueError: no trainable sample, or a sample whose log-probs do not match its tokens.
    """
    rows: list[tuple[Sample, float]] = []
    skipped = 0
    for group in groups:
        usable = [s for s in group if s.status is not SampleStatus.ABORTED and s.response_tokens]
        skipped += len(group) - len(usable)
        for sample, advantage in zip(usable, group_advantages([s.reward for s in usable], eps)):
            if len(sample.rollout_log_probs) != len(sample.response_tokens):
                raise ValueError(
                    f"sample {sample.index}: {len(sample.rollout_log_probs)} log-probs for "
                    f"{len(sample.response_tokens)} response tokens"
                )
            rows.append((sample, advantage))
    if not rows:
        raise ValueError("no trainable sample in the batch")
    length = max(len(s.prompt_tokens) + len(s.response_tokens) for s, _ in rows)
    tokens = torch.full((len(rows), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), length - 1)
    rollout_log_probs = torch.zeros(len(rows), length - 1)
    for row, (sample, _) in enumerate(rows):
        prompt_length, response_length = len(sample.prompt_tokens), len(sample.response_tokens)
        tokens[row, :prompt_length] = torch.tensor(sample.prompt_tokens)
        tokens[row, prompt_length:prompt_length + response_length] = torch.tensor(
            sample.response_tokens
        )
        # Position t predicts token t + 1: the first response token is predicted at
        # prompt_length - 1.
        span = slice(prompt_length - 1, prompt_length - 1 + response_length)
        loss_mask[row, span] = 1.0
        rollout_log_probs[row, span] = torch.tensor(sample.rollout_log_probs)
    return TrainBatch(
        tokens=tokens,
        loss_mask=loss_mask,
        rollout_log_probs=rollout_log_probs,
        advantages=torch.tensor([a for _, a in rows], dtype=torch.float32),
        rewards=torch.tensor([s.reward for s, _ in rows], dtype=torch.float32),
        skipped_samples=skipped,
    )


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each next token: ``out[i, t] = log p(tokens[i, t+1] | tokens[i, :t+1])``."""
    scaled = logits[:, :-1, :] / (temperature if temperature > 0 else 1.0)
    return F.log_softmax(scaled.float(), dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


def behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                      mask: torch.Tensor, config: GRPOConfig
                      ) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The per-token behaviour importance weight ``pi_prox / pi_behav`` as ``config`` bounds it
    (None for ``none``: no weight applied), and the ``off_policy/`` metrics over the response
    tokens (``mask > 0``). No gradient flows through either."""
    with torch.no_grad():
        log_weight = (proximal_log_probs.detach() - behaviour_log_probs) * mask
        raw = torch.exp(log_weight)
        correction = config.off_policy_correction
        weight: torch.Tensor | None = None
        if correction is OffPolicyCorrection.DECOUPLED:
            weight = raw.clamp(max=config.tis_cap)
        elif correction is OffPolicyCorrection.TIS:
            weight = raw.clamp(min=config.tis_clip_low, max=config.tis_cap)
        tokens = mask > 0
        count = max(int(tokens.sum().item()), 1)
        values = raw[tokens] if tokens.any() else raw.new_ones(1)
        quantiles = torch.quantile(values.float(), values.new_tensor([0.5, 0.9, 0.99]).float())
        truncated = 0.0 if weight is None else float(((weight != raw) & tokens).sum()) / count
        metrics = {
            OFF_POLICY_PREFIX + "ratio_p50": float(quantiles[0]),
            OFF_POLICY_PREFIX + "ratio_p90": float(quantiles[1]),
            OFF_POLICY_PREFIX + "ratio_p99": float(quantiles[2]),
            OFF_POLICY_PREFIX + "ratio_max": float(values.max()),
            OFF_POLICY_PREFIX + "truncated_fraction": truncated,
            OFF_POLICY_PREFIX + "behaviour_kl_k3": float(
                ((raw - 1.0) - log_weight).mul(mask).sum() / count),
        }
    return weight, metrics


def grpo_loss(model: nn.Module, batch: TrainBatch,
              config: GRPOConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO loss of ``batch`` under ``model`` (differentiable) and its metrics,
    with the off-policy correction ``config`` names (module docstring)."""
    log_probs = token_log_probs(model(batch.tokens), batch.tokens, config.temperature)
    mask = batch.loss_mask
    num_tokens = mask.sum().clamp(min=1.0)
    proximal = (log_probs.detach() if batch.proximal_log_probs is None
                else batch.proximal_log_probs)
    weight, off_policy_metrics = behaviour_weights(proximal, batch.rollout_log_probs, mask,
                                                   config)
    anchor = batch.rollout_log_probs if weight is None else proximal
    log_ratio = (log_probs - anchor) * mask
    ratio = torch.exp(log_ratio)
    advantages = batch.advantages[:, None].expand_as(ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * advantages
    objective = torch.minimum(unclipped, clipped)
    dual_clipped = torch.zeros_like(objective, dtype=torch.bool)
    if config.dual_clip is not None:
        bound = config.dual_clip * advantages
        dual_clipped = (advantages < 0) & (objective < bound)
        objective = torch.where(dual_clipped, bound, objective)
    if weight is not None:
        objective = objective * weight
    loss = -(objective * mask).sum() / num_tokens
    with torch.no_grad():
        was_clipped = ((unclipped != clipped) & (mask > 0)).float().sum() / num_tokens
        metrics = {
            "loss": float(loss.item()),
            "reward_mean": float(batch.rewards.mean().item()),
            "clip_fraction": float(was_clipped.item()),
            "dual_clip_fraction": float((dual_clipped & (mask > 0)).float().sum() / num_tokens),
            "approx_kl": float(((ratio - 1.0) - log_ratio).mul(mask).sum().div(num_tokens)),
            "ratio_max": float(ratio.masked_fill(mask == 0, 0.0).max().item()),
            "num_tokens": float(num_tokens.item()),
            "num_samples": float(batch.tokens.shape[0]),
            "skipped_samples": float(batch.skipped_samples),
            **off_policy_metrics,
        }
    return loss, metrics
