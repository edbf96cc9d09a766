"""The policy: a tiny causal LM, as megatron-core's ``GPTModel`` or as a plain-torch twin.

Both backends build the same architecture with the same parameter names (megatron's:
``embedding.word_embeddings.weight``, ``decoder.layers.0.self_attention.linear_qkv.weight``,
...), the same fused-QKV layout (per head: q, k, v) and the same initialisation scheme, so a
state dict saved by one loads into the other and gives the same logits. Every model returned by
:func:`build_policy` is called as ``model(tokens[b, s]) -> logits[b, s, vocab]`` (causal).

Megatron is built in :mod:`actors.policies.megatron_gpt` (patched for CPU only where there is
no CUDA); the twin needs none of it and does not import megatron.

LoRA: :func:`apply_lora` wraps the attention (``linear_qkv``, ``linear_proj``) and MLP
(``linear_fc1``, ``linear_fc2``) projections and the ``output_layer`` with low-rank adapters and
freezes everything else (this policy is trained from scratch, so its reward lives mostly in the
output layer: adapters on the projections alone barely moved it);
:func:`adapter_state_dict` returns only the adapter tensors (what the ``lora`` transport moves).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from actors.errors import PolicyError
from actors.transport import is_lora_tensor
from actors.policies.megatron_gpt import build_megatron_gpt, ensure_megatron_parallel_state

__all__ = [
    "BACKENDS",
    "LORA_TARGETS",
    "PROJECTION_LORA_TARGETS",
    "LoRALinear",
    "PolicyConfig",
    "PolicyError",
    "adapter_state_dict",
    "apply_lora",
    "build_policy",
    "check_tensors",
    "ensure_megatron_parallel_state",
    "load_tensors",
    "tensor_state_dict",
]

BACKENDS: tuple[str, ...] = ("torch", "megatron")
PROJECTION_LORA_TARGETS: tuple[str, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
LORA_TARGETS: tuple[str, ...] = (*PROJECTION_LORA_TARGETS, "output_layer")
_INIT_STD = 0.02


@dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the policy. Defaults keep a training step in the milliseconds on CPU.

    ``lora_rank > 0`` builds the model with LoRA adapters on the projections and the base
    frozen; the same config must be used by the trainer and every engine so names match.
    """

    vocab_size: int = 32
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 256
    max_sequence_length: int = 16
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if min(self.vocab_size, self.num_layers, self.hidden_size, self.max_sequence_length) < 1:
            raise ValueError(f"sizes must be positive: {self}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0, got {self.lora_rank}")

    @classmethod
    def from_value(cls, value: PolicyConfig | dict[str, Any] | None) -> PolicyConfig:
        """Accept a config, a dict of its fields (unknown keys are an error), or None."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown policy config keys: {sorted(unknown)}")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# LoRA


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * x A^T B^T`` with ``B`` zero-initialised (a no-op at start).

    Works for plain linears (return a tensor) and megatron's parallel linears (return
    ``(output, bias)``); the result has the same shape as the base's. The base is frozen.
    """

    def __init__(self, base: nn.Module, in_features: int, out_features: int, rank: int,
                 alpha: float) -> None:
        super().__init__()
        self.base = base
        self.scaling = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, in_features))
        self.lora_b = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        for parameter in self.base.parameters():
            parameter.requires_grad_(False)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = self.base(x, *args, **kwargs)
        delta = F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
        if isinstance(out, tuple):
            return (out[0] + delta, *out[1:])
        return out + delta


def _linear_shape(module: nn.Module) -> tuple[int, int]:
    out_features, in_features = module.weight.shape
    return in_features, out_features


def apply_lora(model: nn.Module, rank: int, alpha: float,
               targets: tuple[str, ...] = LORA_TARGETS) -> nn.Module:
    """Wrap every module named in ``targets`` with a :class:`LoRALinear`.

    Freezes all base parameters; only ``lora_a`` / ``lora_b`` train. Idempotent: a model that
    already has adapters is returned unchanged. Returns ``model`` (modified in place).

    Raises:
        PolicyError: no target projection was found (the architecture does not match).
    """
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        return model
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if name in targets
    ]
    if not found:
        raise PolicyError(f"no LoRA target {targets} in {type(model).__name__}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parent, name, child in found:
        in_features, out_features = _linear_shape(child)
        setattr(parent, name, LoRALinear(child, in_features, out_features, rank, alpha))
    return model


def tensor_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a detached tensor keyed by name (what ``full`` moves).

    Megatron's non-tensor ``_extra_state`` entries are left out, so both backends give the
    same keys. The tensors share storage with the model: copy them before mutating.
    """
    return {
        name: value.detach()
        for name, value in model.state_dict().items()
        if isinstance(value, torch.Tensor)
    }


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter tensors (``...lora_a``, ``...lora_b``), detached, keyed by name.

    Raises:
        PolicyError: the model has no adapters.
    """
    adapters = {name: t for name, t in tensor_state_dict(model).items() if is_lora_tensor(name)}
    if not adapters:
        raise PolicyError("the model has no LoRA adapters")
    return adapters


def check_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], adapters_only: bool) -> None:
    """Check that ``tensors`` fit ``model``: exactly its tensors (``adapters_only=False``, a
    ``full`` update) or exactly its adapter tensors (``adapters_only=True``, a ``lora`` update),
    each of the model's shape. Changes nothing.

    Raises:
        PolicyError: a missing, unexpected or mis-shaped tensor.
    """
    own = tensor_state_dict(model)
    expected = {name for name in own if is_lora_tensor(name)} if adapters_only else set(own)
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise PolicyError(
            f"weights do not match the model: missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]}"
        )
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise PolicyError(f"{name}: shape {tuple(tensor.shape)} != {tuple(own[name].shape)}")


def load_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], adapters_only: bool) -> None:
    """Copy ``tensors`` into ``model`` in place, after :func:`check_tensors`: all checks run
    before the first copy, so on error the model is unchanged.

    Raises:
        PolicyError: a missing, unexpected or mis-shaped tensor.
    """
    check_tensors(model, tensors, adapters_only)
    own = tensor_state_dict(model)
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)


# --------------------------------------------------------------------------------------------
# The plain-torch twin


@dataclass
class LayerCache:
    """One layer's attention keys and values so far, ``[batch, heads, positions, head_dim]``."""

    key: torch.Tensor | None = None
    value: torch.Tensor | None = None

    def extend(self, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new positions' keys and values; returns all of them."""
        if self.key is not None and self.value is not None:
            key, value = torch.cat([self.key, key], dim=2), torch.cat([self.value, value], dim=2)
        self.key, self.value = key, value
        return key, value


@dataclass
class DecodeCache:
    """The key/value cache of an incremental decode: valid only for the weights it was built
    with (a weight update must start a new one)."""

    layers: list[LayerCache]
    length: int = 0


class _Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, std: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features).normal_(0.0, std))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Embedding(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_sequence_length, config.hidden_size)
        nn.init.normal_(self.word_embeddings.weight, 0.0, _INIT_STD)
        nn.init.normal_(self.position_embeddings.weight, 0.0, _INIT_STD)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
        return self.word_embeddings(tokens) + self.position_embeddings(positions)


class _SelfAttention(nn.Module):
    def __init__(self, config: PolicyConfig, output_std: float) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        hidden = config.hidden_size
        self.linear_qkv = _Linear(hidden, 3 * hidden, bias=True, std=_INIT_STD)
        self.linear_proj = _Linear(hidden, hidden, bias=True, std=output_std)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.num_heads
        # Megatron's fused layout: for each head, its q, k and v rows are adjacent.
        qkv = self.linear_qkv(x).view(batch, seq, self.num_heads, 3, head_dim)
        query, key, value = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        if cache is not None:
            key, value = cache.extend(key, value)
        # New positions attend causally among themselves and to every cached one.
        causal = query.shape[2] > 1
        if causal and key.shape[2] != query.shape[2]:
            raise ValueError("a cached decode step takes one position, or all of them")
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=causal)
        return self.linear_proj(attended.transpose(1, 2).reshape(batch, seq, hidden))


class _MLP(nn.Module):
    def __init__(self, config: PolicyConfig, output_std: float) -> None:
        super().__init__()
        self.linear_fc1 = _Linear(config.hidden_size, config.ffn_hidden_size, True, _INIT_STD)
        self.linear_fc2 = _Linear(config.ffn_hidden_size, config.hidden_size, True, output_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class _Layer(nn.Module):
    def __init__(self, config: PolicyConfig, output_std: float) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=1e-5)
        self.self_attention = _SelfAttention(config, output_std)
        self.pre_mlp_layernorm = nn.LayerNorm(config.hidden_size, eps=1e-5)
        self.mlp = _MLP(config, output_std)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        x = x + self.self_attention(self.input_layernorm(x), cache)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class _Decoder(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        # Megatron's scaled init for the projections that write into the residual stream.
        output_std = _INIT_STD / math.sqrt(2.0 * config.num_layers)
        self.layers = nn.ModuleList(_Layer(config, output_std) for _ in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=1e-5)

    def forward(self, x: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache.layers[index])
        return self.final_layernorm(x)


class TorchCausalLM(nn.Module):
    """The plain-torch twin of the megatron policy (same names, layout and maths)."""

    backend = "torch"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = _Embedding(config)
        self.decoder = _Decoder(config)
        self.output_layer = _Linear(config.hidden_size, config.vocab_size, False, _INIT_STD)

    def forward(self, tokens: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]``. With ``cache``, ``tokens`` continue the positions it
        holds (all of a prompt first, then one at a time) and are added to it."""
        offset = 0 if cache is None else cache.length
        logits = self.output_layer(self.decoder(self.embedding(tokens, offset), cache))
        if cache is not None:
            cache.length += tokens.shape[1]
        return logits

    def new_cache(self) -> DecodeCache:
        """An empty key/value cache for :meth:`forward` (one per batch of sequences)."""
        return DecodeCache([LayerCache() for _ in self.decoder.layers])


# --------------------------------------------------------------------------------------------


def build_policy(
    backend: str, config: PolicyConfig | dict[str, Any] | None = None, seed: int = 0
) -> nn.Module:
    """Build the policy on CPU: same ``(backend, config, seed)`` gives the same weights.

    The global torch RNG is left untouched (initialisation runs in a forked RNG). With
    ``config.lora_rank > 0`` the model carries LoRA adapters and a frozen base.

    Raises:
        PolicyError: unknown backend, or (megatron) a foreign torch.distributed world.
        ValueError: an invalid config.
    """
    policy_config = PolicyConfig.from_value(config)
    if backend not in BACKENDS:
        raise PolicyError(f"unknown policy backend {backend!r}; expected one of {BACKENDS}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if backend == "torch":
            model: nn.Module = TorchCausalLM(policy_config)
        else:
            model = build_megatron_gpt(policy_config, seed, init_std=_INIT_STD)
        if policy_config.lora_rank > 0:
            apply_lora(model, policy_config.lora_rank, policy_config.lora_alpha)
    return model
