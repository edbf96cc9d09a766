"""What a vLLM engine's weights are, under Hugging Face names, and what an update changes.

vLLM holds its weights fused and re-laid-out (``qkv_proj``, ``gate_up_proj``), so the engine
keeps its *logical* weights beside it: the checkpoint it was launched with, then what each
update gave it. They answer ``weights_checksum`` with the same names and bytes the trainer
has, and they are the frozen base a LoRA update is merged onto.

LoRA is **merged** (not vLLM's LoRA support): an adapter update ``(A, B)`` of a projection
``P`` reloads ``P.weight = base + (alpha / rank) * B @ A``. Why merged: vLLM's LoRA path takes
adapters from a directory per request (a file round trip and a new adapter id per version),
and the merged weights give the same logits as the trainer's ``LoRALinear`` forward pass; the
base is never changed by a ``lora`` update, as the transport promises.

Every check runs before anything changes (:meth:`EngineWeights.plan`); the engine applies a
plan to vLLM and only then records it (:meth:`EngineWeights.record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from actors.errors import PolicyError
from actors.publishing.weight_sync import tensors_checksum
from actors.transport import Transport, is_lora_tensor
from actors.weight_paths import open_weights

__all__ = ["EngineWeights", "UpdatePlan"]

@dataclass(frozen=True)
class UpdatePlan:
    """What one ``load_weights`` sends to vLLM (``reload``) and keeps as logical state."""

    transport: Transport
    received: dict[str, torch.Tensor]
    reload: dict[str, torch.Tensor]


class EngineWeights:
    """An engine's logical weights: the launch checkpoint, the current state, the adapters.

    Args:
        checkpoint: the launch weights by HF name (what vLLM loaded from the directory).
        lora_alpha: the adapters' scale numerator (the trainer's ``lora_alpha``).
        tied_embeddings: the checkpoint ties ``lm_head`` to the embedding (a trainer's
            state then names ``lm_head.weight`` although the checkpoint does not).
    """

    def __init__(self, checkpoint: dict[str, torch.Tensor], lora_alpha: float = 16.0,
                 tied_embeddings: bool = False) -> None:
        self.base = {name: tensor.detach().float() for name, tensor in checkpoint.items()}
        self.current = dict(self.base)
        self.adapters: dict[str, torch.Tensor] = {}
        self.lora_alpha = lora_alpha
        self.tied_embeddings = tied_embeddings

    def receive(self, transferred: Any, transport: str) -> tuple[UpdatePlan, str]:
        """:meth:`plan` for a transfer's tensors, opened (a packed buffer, or CUDA IPC
        handles on our GPU), and their sha256 as received; changes nothing."""
        plan = self.plan(open_weights(transferred), transport)
        return plan, tensors_checksum(plan.received)

    def checksum(self, adapters_only: bool = False) -> str:
        """sha256 of :meth:`tensors` (all, or the last adapters) by HF name."""
        return tensors_checksum(self.tensors(adapters_only))

    def plan(self, tensors: dict[str, torch.Tensor], transport: str) -> UpdatePlan:
        """Check ``tensors`` for ``transport`` and compute what to reload; changes nothing.

        ``full``: every checkpoint tensor, same shapes (``lm_head.weight`` may be extra when
        embeddings are tied). ``lora``: ``<projection>.lora_a`` ``[r, in]`` and ``.lora_b``
        ``[out, r]`` pairs for projections of the checkpoint; the reload is the merged
        projections, plus the base of any tensor a full update had changed.

        Raises:
            PolicyError: a missing, unexpected or mis-shaped tensor.
            ValueError: unknown transport.
        """
        # CPU copies (no-ops for CPU tensors): the logical state must not hold on to a
        # publisher's CUDA memory opened by IPC, and the LoRA base lives on the CPU.
        received = {name: tensor.detach().float().cpu() for name, tensor in tensors.items()}
        transport = Transport.parse(transport)
        if transport is Transport.FULL:
            return UpdatePlan(transport, received, self._check_full(received))
        merged = self._merge_adapters(received)
        # Anything a full update moved away from the base goes back to it as well.
        restored = {name: self.base[name] for name, tensor in self.current.items()
                    if tensor is not self.base[name] and name not in merged}
        return UpdatePlan(transport, received, {**restored, **merged})

    def record(self, plan: UpdatePlan) -> None:
        """Adopt a plan that vLLM has loaded."""
        if plan.transport is Transport.FULL:
            self.current = dict(plan.reload)
            self.adapters = {}
        else:
            self.current = {**self.base, **plan.reload}
            self.adapters = dict(plan.received)

    def tensors(self, adapters_only: bool = False) -> dict[str, torch.Tensor]:
        """The current logical weights (or the last adapters received) by HF name."""
        return dict(self.adapters if adapters_only else self.current)

    def _check_full(self, received: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        allowed = set(self.base) | ({"lm_head.weight"} if self.tied_embeddings else set())
        missing, unexpected = set(self.base) - set(received), set(received) - allowed
        if missing or unexpected:
            raise PolicyError(f"weights do not match the engine's model: missing "
                              f"{sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
        for name, tensor in received.items():
            expected = self.base.get(name, self.base.get("model.embed_tokens.weight"))
            if expected is not None and tuple(tensor.shape) != tuple(expected.shape):
                raise PolicyError(f"{name}: shape {tuple(tensor.shape)} != "
                                  f"{tuple(expected.shape)}")
        return {name: received[name] for name in self.base}

    def _merge_adapters(self, received: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not received or not all(is_lora_tensor(name) for name in received):
            raise PolicyError("a lora update carries only ...lora_a / ...lora_b tensors")
        modules = {name.rsplit(".", 1)[0] for name in received}
        merged: dict[str, torch.Tensor] = {}
        for module in sorted(modules):
            weight_name = f"{module}.weight"
            base = self.base.get(weight_name)
            down, up = received.get(f"{module}.lora_a"), received.get(f"{module}.lora_b")
            if base is None or down is None or up is None:
                raise PolicyError(f"adapter of {module!r} is incomplete or names no "
                                  "projection of the engine's model")
            rank = down.shape[0]
            if (down.ndim != 2 or up.ndim != 2 or up.shape[1] != rank
                    or (up.shape[0], down.shape[1]) != tuple(base.shape)):
                raise PolicyError(f"adapter of {module!r}: shapes {tuple(down.shape)}, "
                                  f"{tuple(up.shape)} do not fit {tuple(base.shape)}")
            merged[weight_name] = base + (self.lora_alpha / rank) * (up @ down)
        return merged
