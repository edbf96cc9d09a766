"""megatron-core ``GPTModel`` as a Llama, and the bridge between its names and Hugging Face's.

With ``--backend megatron --engine vllm`` the trainer is a megatron-core ``GPTModel`` built
with Llama's settings (RMSNorm, SwiGLU MLP, rotary positions, no biases, grouped-query
attention) from the same ``save_pretrained`` directory the vLLM engines load. Its tensors
carry megatron's names and layouts; vLLM takes Hugging Face's. The publisher converts on the
way out, as miles' megatron-to-HF bridge does (:func:`megatron_to_hf`), so engines receive
exactly what they would load from a checkpoint. The reverse (:func:`hf_to_megatron`) starts the
trainer from the directory's weights, so version 0 is the same model on both sides.

Layouts (``nq`` query heads, ``ng`` key/value groups, ``d`` head size, ``f`` MLP size):

==========================================  ===============================================
megatron                                    Hugging Face Llama
==========================================  ===============================================
``embedding.word_embeddings.weight``         ``model.embed_tokens.weight``
``decoder.layers.i.input_layernorm.weight``  ``model.layers.i.input_layernorm.weight``
``...self_attention.linear_qkv.weight``      ``...self_attn.{q,k,v}_proj.weight``: rows are
  ``[ng, nq/ng + 2, d, hidden]``               grouped per key/value group: the group's query
                                               heads, then its key, then its value
``...self_attention.linear_proj.weight``     ``...self_attn.o_proj.weight``
``...pre_mlp_layernorm.weight``              ``...post_attention_layernorm.weight``
``...mlp.linear_fc1.weight`` ``[2f, h]``     ``...mlp.gate_proj.weight`` (first half),
                                               ``...mlp.up_proj.weight`` (second half)
``...mlp.linear_fc2.weight``                 ``...mlp.down_proj.weight``
``decoder.final_layernorm.weight``           ``model.norm.weight``
``output_layer.weight``                      ``lm_head.weight``
==========================================  ===============================================

LoRA adapters (``...linear_qkv.lora_a`` / ``.lora_b``) convert the same way: ``lora_b`` rows
split like the weight's, ``lora_a`` is shared by the parts (``B_q A`` is the query rows of
``B A``), so an engine merging ``W + (alpha/r) B A`` per HF projection gets megatron's update.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from actors.policies.hf_policy import HFPolicyConfig, hf_config, read_checkpoint
from actors.policies.megatron_gpt import prepare_megatron_device
from actors.policies.policy import (
    PROJECTION_LORA_TARGETS,
    PolicyError,
    apply_lora,
    ensure_megatron_parallel_state,
    load_tensors,
)

__all__ = ["LlamaShape", "build_megatron_llama", "hf_to_megatron", "megatron_to_hf"]


class LlamaShape:
    """The sizes the conversion needs, read from a Hugging Face Llama config."""

    def __init__(self, config: Any) -> None:
        self.hidden_size = int(config.hidden_size)
        self.num_heads = int(config.num_attention_heads)
        self.num_groups = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or self.hidden_size // self.num_heads)
        self.ffn_size = int(config.intermediate_size)
        self.num_layers = int(config.num_hidden_layers)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if self.num_heads % self.num_groups:
            raise PolicyError(f"{self.num_heads} heads do not split into {self.num_groups} groups")

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_groups


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_SIMPLE = {  # megatron suffix inside a layer -> HF suffix inside a layer
    "input_layernorm": "input_layernorm",
    "self_attention.linear_proj": "self_attn.o_proj",
    "pre_mlp_layernorm": "post_attention_layernorm",
    "mlp.linear_fc2": "mlp.down_proj",
}
_LEAVES = ("weight", "lora_a", "lora_b")  # a biased Llama is refused before it gets here
_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def _split_qkv(rows: torch.Tensor, shape: LlamaShape) -> tuple[torch.Tensor, ...]:
    """Split fused QKV rows (weight or LoRA B) into q, k, v rows."""
    grouped = rows.reshape(shape.num_groups, shape.heads_per_group + 2, shape.head_dim, -1)
    per_group = shape.heads_per_group
    query = grouped[:, :per_group].reshape(-1, rows.shape[-1])
    key = grouped[:, per_group].reshape(-1, rows.shape[-1])
    value = grouped[:, per_group + 1].reshape(-1, rows.shape[-1])
    return query, key, value


def _fuse_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              shape: LlamaShape) -> torch.Tensor:
    columns = query.shape[-1]
    grouped = torch.cat([
        query.reshape(shape.num_groups, shape.heads_per_group, shape.head_dim, columns),
        key.reshape(shape.num_groups, 1, shape.head_dim, columns),
        value.reshape(shape.num_groups, 1, shape.head_dim, columns),
    ], dim=1)
    return grouped.reshape(-1, columns)


def megatron_to_hf(tensors: dict[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """Rename and re-layout megatron Llama tensors (weights or LoRA adapters) to HF's.

    Accepts a full state (every weight) or only adapters (``...lora_a`` / ``...lora_b``);
    returns new tensors (inputs are not modified). A tied output layer gives ``lm_head.weight``
    from the embedding.

    Raises:
        PolicyError: a name the bridge does not know (another architecture, biases).
    """
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        name = name.replace(".base.", ".")  # a LoRA-wrapped projection's frozen weight
        if name in _TOP:
            converted[_TOP[name]] = tensor.clone()
            continue
        match = _LAYER.match(name)
        if match is None:
            raise PolicyError(f"no Hugging Face name for megatron tensor {name!r}")
        layer, rest = match.group(1), match.group(2)
        module, _, leaf = rest.rpartition(".")
        prefix = f"model.layers.{layer}"
        if leaf not in _LEAVES:
            raise PolicyError(f"no Hugging Face name for megatron tensor {name!r}")
        if module in _SIMPLE:
            converted[f"{prefix}.{_SIMPLE[module]}.{leaf}"] = tensor.clone()
        elif module == "self_attention.linear_qkv":
            parts = (_split_qkv(tensor, shape) if leaf in ("weight", "lora_b")
                     else (tensor, tensor, tensor))
            for projection, part in zip(("q_proj", "k_proj", "v_proj"), parts):
                converted[f"{prefix}.self_attn.{projection}.{leaf}"] = part.clone()
        elif module == "mlp.linear_fc1":
            parts = (tensor.chunk(2, dim=0) if leaf in ("weight", "lora_b")
                     else (tensor, tensor))
            for projection, part in zip(("gate_proj", "up_proj"), parts):
                converted[f"{prefix}.mlp.{projection}.{leaf}"] = part.clone()
        else:
            raise PolicyError(f"no Hugging Face name for megatron tensor {name!r}")
    if shape.tied and "model.embed_tokens.weight" in converted:
        converted["lm_head.weight"] = converted["model.embed_tokens.weight"].clone()
    return converted


def hf_to_megatron(tensors: dict[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """The inverse of :func:`megatron_to_hf` for full weights (a checkpoint's tensors).

    Raises:
        PolicyError: a name the bridge does not know, or a missing q/k/v or gate/up part.
    """
    top = {hf: megatron for megatron, hf in _TOP.items()}
    simple = {hf: megatron for megatron, hf in _SIMPLE.items()}
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name in top:
            if not (shape.tied and name == "lm_head.weight"):
                converted[top[name]] = tensor.clone()
            continue
        match = _HF_LAYER.match(name)
        module, _, leaf = (match.group(2) if match else "").rpartition(".")
        if match is None or (module not in simple and module not in (
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                "mlp.gate_proj", "mlp.up_proj")):
            raise PolicyError(f"no megatron name for Hugging Face tensor {name!r}")
        if module in simple:
            converted[f"decoder.layers.{match.group(1)}.{simple[module]}.{leaf}"] = tensor.clone()
    try:
        for layer in range(shape.num_layers):
            hf, megatron = f"model.layers.{layer}", f"decoder.layers.{layer}"
            converted[f"{megatron}.self_attention.linear_qkv.weight"] = _fuse_qkv(
                *(tensors[f"{hf}.self_attn.{p}_proj.weight"] for p in "qkv"), shape)
            converted[f"{megatron}.mlp.linear_fc1.weight"] = torch.cat(
                [tensors[f"{hf}.mlp.gate_proj.weight"], tensors[f"{hf}.mlp.up_proj.weight"]])
    except KeyError as exc:
        raise PolicyError(f"Hugging Face tensor {exc.args[0]!r} is missing") from None
    return converted


_LLAMA_CLASS: type[nn.Module] | None = None


def _llama_class() -> type[nn.Module]:
    global _LLAMA_CLASS
    if _LLAMA_CLASS is None:
        from megatron.core.models.gpt.gpt_model import GPTModel

        class MegatronLlama(GPTModel):
            """megatron-core GPTModel with rotary positions, called as ``model(tokens)``."""

            backend = "megatron"

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                batch, seq = tokens.shape
                positions = torch.arange(seq, device=tokens.device).unsqueeze(0).expand(batch, seq)
                # Explicit mask (True = hidden): megatron's default one is built on "cuda".
                mask = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).triu(1)
                return super().forward(tokens, positions, attention_mask=mask.view(1, 1, seq, seq))

        _LLAMA_CLASS = MegatronLlama
    return _LLAMA_CLASS


def _rope_theta(config: Any) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    if parameters.get("rope_type", "default") != "default":
        raise PolicyError(f"rope scaling {parameters.get('rope_type')!r} is not supported")
    return float(parameters.get("rope_theta") or getattr(config, "rope_theta", 10000.0))


def build_megatron_llama(config: HFPolicyConfig | dict[str, Any], seed: int = 0) -> nn.Module:
    """A megatron-core GPTModel with Llama's architecture, holding the weights of
    ``config.model_dir`` (LoRA adapters on top if ``config.lora_rank > 0``).

    Raises:
        PolicyError: not a Llama the bridge supports (biases, scaled rope), or a foreign
            ``torch.distributed`` world.
    """
    policy_config = HFPolicyConfig.from_value(config)
    llama = hf_config(policy_config.model_dir)
    if getattr(llama, "attention_bias", False) or getattr(llama, "mlp_bias", False):
        raise PolicyError("Llama checkpoints with biases are not supported by the bridge")
    shape = LlamaShape(llama)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        ensure_megatron_parallel_state()
        prepare_megatron_device(seed)  # patches only without CUDA
        transformer_config = TransformerConfig(
            num_layers=shape.num_layers,
            hidden_size=shape.hidden_size,
            num_attention_heads=shape.num_heads,
            num_query_groups=shape.num_groups,
            kv_channels=shape.head_dim,
            ffn_hidden_size=shape.ffn_size,
            normalization="RMSNorm",
            layernorm_epsilon=float(llama.rms_norm_eps),
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            add_qkv_bias=False,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            pipeline_dtype=torch.float32,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _llama_class()(
                config=transformer_config,
                transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                vocab_size=int(llama.vocab_size),
                max_sequence_length=int(llama.max_position_embeddings),
                position_embedding_type="rope",
                rotary_base=_rope_theta(llama),
                rotary_percent=1.0,
                share_embeddings_and_output_weights=shape.tied,
            )
            load_tensors(model, hf_to_megatron(read_checkpoint(policy_config.model_dir),
                                               shape), adapters_only=False)
            if policy_config.lora_rank > 0:
                # The projections only, as HF_LORA_TARGETS (what the vLLM engine merges).
                apply_lora(model, policy_config.lora_rank, policy_config.lora_alpha,
                           targets=PROJECTION_LORA_TARGETS)
    return model
