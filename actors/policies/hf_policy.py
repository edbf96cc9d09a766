"""The Hugging Face policy: a ``transformers`` Llama causal LM in ``save_pretrained`` layout.

Its parameter names (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``, ...) are
the ones vLLM's Llama loader takes, so a weight update hands the trainer's tensors to a vLLM
engine as they are (:mod:`actors.engines.vllm.engine`). The megatron-core backend reaches the same
names through :mod:`actors.policies.megatron_llama`.

Where the model comes from (:func:`ensure_task_model`): a directory the user names
(``--model PATH``), or, when none is given, a tiny random Llama plus a tokenizer for the task,
made locally (``tokenizers`` + ``PreTrainedTokenizerFast``) and cached under the run
directory. Nothing is ever downloaded: every load is ``local_files_only``.

The toy task speaks its own vocabulary (:mod:`actors.task`): prompts are token ids, and the
reward decodes response ids with the task's symbol list. So a model must map each of the task's
symbols to the task's id (the tiny model is built that way); :func:`check_task_vocabulary`
refuses any other model with a :class:`~actors.errors.PolicyError` instead of training garbage.

Every model :func:`build_hf_policy` returns is called as ``model(tokens[b, s]) ->
logits[b, s, vocab]`` (causal), like the built-in policies. LoRA (:func:`apply_hf_lora`) wraps
the attention and MLP projections with :class:`actors.policies.policy.LoRALinear`; adapter tensors are
named ``<projection>.lora_a`` / ``.lora_b`` (``model.layers.0.self_attn.q_proj.lora_a``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from actors.policies.policy import PolicyError
from actors.policies.task_vocabulary import check_task_vocabulary, offline
from ledger.store.atomic_files import replace_directory

__all__ = [
    "HF_LORA_TARGETS",
    "HFPolicyConfig",
    "TinyLlamaSizes",
    "apply_hf_lora",
    "build_hf_policy",
    "check_task_vocabulary",
    "ensure_task_model",
    "hf_config",
    "read_checkpoint",
]

HF_LORA_TARGETS: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)
_MARKER = "rl-ledger-task-model.json"


@dataclass(frozen=True)
class HFPolicyConfig:
    """What every cell and engine of a run builds its Llama policy from.

    ``model_dir``: a local ``save_pretrained`` directory (config, safetensors, tokenizer).
    ``lora_rank > 0`` trains adapters on :data:`HF_LORA_TARGETS` with a frozen base.
    """

    model_dir: str
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0, got {self.lora_rank}")

    @classmethod
    def from_value(cls, value: HFPolicyConfig | dict[str, Any]) -> HFPolicyConfig:
        """Accept a config or a dict of its fields (unknown keys are an error)."""
        if isinstance(value, cls):
            return value
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown HF policy config keys: {sorted(unknown)}")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TinyLlamaSizes:
    """Sizes of the random Llama made for the task when no ``--model`` is given.

    ``hidden_size / num_attention_heads`` must be a head size vLLM's CPU attention supports
    (32, 64, 80, 96, 112, 128, 256; 16 is refused at the first forward pass).
    """

    hidden_size: int = 64
    num_attention_heads: int = 2
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    max_position_embeddings: int = 32


def _offline() -> None:
    offline()  # belt and braces: no code path of ours may reach a hub
    # Progress bars for a model of a few hundred kB only clutter the run's terminal.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def hf_config(model_dir: str | Path) -> Any:
    """The ``transformers`` config of the Llama in ``model_dir`` (read locally).

    Raises:
        PolicyError: no readable config, or not a Llama architecture.
    """
    _offline()
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"no Hugging Face model in {model_dir}: {exc}") from None
    if config.model_type != "llama":
        raise PolicyError(f"{model_dir}: model_type {config.model_type!r} is not supported "
                          "(the HF backend and the vLLM engine take Llama checkpoints)")
    return config


def _save_task_tokenizer(directory: Path, symbols: Sequence[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {symbol: index for index, symbol in enumerate(symbols)}
    core = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<pad>",
    )
    tokenizer.save_pretrained(str(directory))


def ensure_task_model(directory: str | Path, symbols: Sequence[str], seed: int,
                      sizes: TinyLlamaSizes = TinyLlamaSizes()) -> Path:
    """A tiny random Llama and a tokenizer for ``symbols`` in ``directory``; returns it.

    Cached: a directory that already holds the model made from the same ``(symbols, seed,
    sizes)`` is returned as it is (a resumed run finds the model its engines started with).
    Written to a temporary sibling first and renamed, so a crash never leaves half a model.
    Token ids are positions in ``symbols``; ``<pad>``, ``<eos>`` and ``<bos>`` must be among
    them.

    Raises:
        PolicyError: ``directory`` holds a model made from other parameters.
        OSError: the directory cannot be written.
    """
    _offline()
    target = Path(directory)
    recipe = {"symbols": list(symbols), "seed": seed, "sizes": asdict(sizes)}
    marker = target / _MARKER
    if marker.exists():
        if json.loads(marker.read_text(encoding="utf-8")) != recipe:
            raise PolicyError(f"{target} holds a task model made from other parameters")
        return target
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(symbols),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_hidden_layers,
        num_attention_heads=sizes.num_attention_heads,
        num_key_value_heads=sizes.num_attention_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        pad_token_id=list(symbols).index("<pad>"),
        eos_token_id=list(symbols).index("<eos>"),
        bos_token_id=list(symbols).index("<bos>"),
        tie_word_embeddings=False,
    )
    temporary = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    temporary.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(str(temporary))
    _save_task_tokenizer(temporary, symbols)
    (temporary / _MARKER).write_text(json.dumps(recipe), encoding="utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        replace_directory(temporary, target)  # fsync of the files, the rename, the parent
    except OSError:
        if not marker.exists():  # not another process that made the same model first
            raise
    return target


def read_checkpoint(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in ``model_dir`` (sharded or not), by HF name.

    Raises:
        PolicyError: no safetensors file in the directory.
    """
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise PolicyError(f"no safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


_CAUSAL_LM_CLASS: type[nn.Module] | None = None


def _causal_lm_class() -> type[nn.Module]:
    """``LlamaForCausalLM`` called as ``model(tokens) -> logits`` (same parameter names)."""
    global _CAUSAL_LM_CLASS
    if _CAUSAL_LM_CLASS is None:
        from transformers import LlamaForCausalLM

        class HFCausalLM(LlamaForCausalLM):
            """A Llama whose forward takes token ids and returns the logits tensor."""

            backend = "hf"

            def forward(  # type: ignore[override]
                self, tokens: torch.Tensor, **_: Any
            ) -> torch.Tensor:
                return super().forward(input_ids=tokens, use_cache=False).logits

        _CAUSAL_LM_CLASS = HFCausalLM
    return _CAUSAL_LM_CLASS


def apply_hf_lora(model: nn.Module, rank: int, alpha: float) -> nn.Module:
    """Wrap every :data:`HF_LORA_TARGETS` linear with a LoRA adapter, freeze everything else.

    Idempotent. Returns ``model`` (modified in place).

    Raises:
        PolicyError: no target projection found.
    """
    from actors.policies.policy import LoRALinear

    if any(isinstance(m, LoRALinear) for m in model.modules()):
        return model
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if name in HF_LORA_TARGETS and isinstance(child, nn.Linear)]
    if not targets:
        raise PolicyError(f"no LoRA target {HF_LORA_TARGETS} in {type(model).__name__}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parent, name, child in targets:
        setattr(parent, name, LoRALinear(child, child.in_features, child.out_features, rank,
                                         alpha))
    return model


def build_hf_policy(config: HFPolicyConfig | dict[str, Any], seed: int = 0) -> nn.Module:
    """Load the Llama in ``config.model_dir`` in float32 on CPU (LoRA adapters if asked).

    ``seed`` initialises the adapters only (the weights come from the directory), so every
    cell of a run starts identical. The global torch RNG is left untouched.

    Raises:
        PolicyError: no Llama checkpoint in the directory.
    """
    policy_config = HFPolicyConfig.from_value(config)
    hf_config(policy_config.model_dir)  # a clear error before transformers' own
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _causal_lm_class().from_pretrained(
            policy_config.model_dir, local_files_only=True, dtype=torch.float32,
            attn_implementation="sdpa",
        )
        if policy_config.lora_rank > 0:
            apply_hf_lora(model, policy_config.lora_rank, policy_config.lora_alpha)
    return model
