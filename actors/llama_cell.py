"""LlamaTrainCell: a train cell whose policy is a Llama checkpoint, published under HF names.

The trainer side of ``--engine vllm``. Everything a :class:`~actors.train_cell.TrainCell` does
(GRPO step, gradient group, the weight-update sequence of DESIGN section 5, checkpoints,
healing) is inherited unchanged; only the model and the names on the wire differ:

- ``backend="hf"``: a ``transformers`` Llama
  (:func:`actors.policies.hf_policy.build_hf_policy`). Its parameter names are vLLM's, so a
  publish sends them as they are.
- ``backend="megatron"``: a megatron-core ``GPTModel`` with Llama's architecture
  (:func:`actors.policies.megatron_llama.build_megatron_llama`); ``outgoing_weights`` converts
  its tensors to HF names and layouts on the way out
  (:func:`actors.policies.megatron_llama.megatron_to_hf`), and the checksum committed to the
  ledger is the one of what the engines received.

Both start from the weights of ``policy.model_dir``, the directory the engines load, so
version 0 is the same model everywhere.

Why a subclass that swaps the model after ``TrainCell.__init__`` (which builds a throwaway
policy of a few dozen parameters): ``TrainCell`` builds its model with
``actors.policies.policy.build_policy`` and has no seam for another builder; until it has one, this
keeps the cell's own code untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from actors.optimizer import EagerAdamW
from actors.policies.hf_policy import HFPolicyConfig, build_hf_policy, hf_config
from actors.policies.policy import PolicyConfig, PolicyError
from actors.startup_gc import settles_heap
from actors.train_cell import TRAIN_CELL_ACTOR_OPTIONS, TrainCell

__all__ = ["LLAMA_BACKENDS", "LlamaTrainCell", "build_llama_policy"]

LLAMA_BACKENDS: tuple[str, ...] = ("hf", "megatron")
LLAMA_CELL_ACTOR_OPTIONS = TRAIN_CELL_ACTOR_OPTIONS


def build_llama_policy(backend: str, policy: HFPolicyConfig | dict[str, Any],
                       seed: int = 0) -> nn.Module:
    """The Llama of ``policy.model_dir`` as a ``transformers`` model or a megatron-core one.

    Raises:
        PolicyError: unknown backend, or no supported Llama checkpoint in the directory.
    """
    if backend == "hf":
        return build_hf_policy(policy, seed)
    if backend == "megatron":
        from actors.policies.megatron_llama import build_megatron_llama

        return build_megatron_llama(policy, seed)
    raise PolicyError(f"unknown Llama backend {backend!r}; expected one of {LLAMA_BACKENDS}")


def _sizes(policy: HFPolicyConfig) -> PolicyConfig:
    """The checkpoint's sizes as a PolicyConfig: what cells compare before healing."""
    config = hf_config(policy.model_dir)
    return PolicyConfig(
        vocab_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size), num_attention_heads=int(config.num_attention_heads),
        ffn_hidden_size=int(config.intermediate_size),
        max_sequence_length=int(config.max_position_embeddings),
        lora_rank=policy.lora_rank, lora_alpha=policy.lora_alpha,
    )


_STUB_SIZES = {"vocab_size": 2, "num_layers": 1, "hidden_size": 4, "num_attention_heads": 1,
               "ffn_hidden_size": 4, "max_sequence_length": 2}


class LlamaTrainCell(TrainCell):
    """A :class:`TrainCell` over a Llama checkpoint (``backend`` "hf" or "megatron")."""

    @settles_heap
    def __init__(self, cell_id: str, backend: str, policy: HFPolicyConfig | dict[str, Any],
                 seed: int = 0, transport: str = "full", learning_rate: float = 3e-3,
                 **cell_options: Any) -> None:
        """Build the Llama of ``policy`` and an AdamW like ``TrainCell``'s (same learning rate
        and weight decay) over its trainable parameters; ``cell_options`` go to
        :class:`TrainCell` (``grpo``, ``ledger_url``, ``run_id``, ...).

        Raises:
            ValueError: unknown transport, or ``lora`` without ``policy.lora_rank > 0``.
            PolicyError: unknown backend, or no supported Llama in ``policy.model_dir``.
        """
        llama = HFPolicyConfig.from_value(policy)
        if backend not in LLAMA_BACKENDS:
            raise PolicyError(f"unknown Llama backend {backend!r}; expected {LLAMA_BACKENDS}")
        stub = PolicyConfig(**_STUB_SIZES, lora_rank=llama.lora_rank,
                            lora_alpha=llama.lora_alpha)
        super().__init__(cell_id, "torch", stub, seed, transport, learning_rate, **cell_options)
        self.backend = backend
        self.llama = llama
        self.policy_config = _sizes(llama)
        self.model = build_llama_policy(backend, llama, seed).to(self.device).train()
        self._parameters = [p for p in self.model.parameters() if p.requires_grad]
        group = self.optimizer.param_groups[0]
        self.optimizer = EagerAdamW(self._parameters, lr=group["lr"],
                                    weight_decay=group["weight_decay"])
        self._shape = None
        if backend == "megatron":
            from actors.policies.megatron_llama import LlamaShape

            self._shape = LlamaShape(hf_config(llama.model_dir))

    def outgoing_weights(self) -> dict[str, torch.Tensor]:
        """What a publish sends, under Hugging Face names: megatron tensors are converted on
        the way out (the checksum committed is of the converted tensors, what engines get).

        Raises:
            PolicyError: a megatron tensor the bridge has no Hugging Face name for.
        """
        tensors = super().outgoing_weights()
        if self._shape is None:
            return tensors
        from actors.policies.megatron_llama import megatron_to_hf

        with torch.no_grad():
            return megatron_to_hf(tensors, self._shape)
