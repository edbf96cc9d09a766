"""megatron-core's ``GPTModel`` as the policy, on CPU or on CUDA.

megatron-core's parallel state is process-global and needs ``torch.distributed``; each process
that builds a megatron policy initialises its own world of size 1 on a file store
(:func:`ensure_megatron_parallel_state`): gloo without CUDA, NCCL for CUDA tensors (with gloo
for CPU ones) where CUDA is present, as megatron expects. Cross-cell gradient averaging never
uses that default group (see :mod:`actors.gradient_group`). The importing of megatron is lazy:
it takes seconds.

Device set-up (:func:`prepare_megatron_device`, the one place for both megatron policies):
without CUDA, megatron-core 0.16 is patched to run on CPU; with CUDA nothing is patched and its
CUDA RNG tracker is seeded as megatron's own training loop does. Weights are initialised on the
CPU (``use_cpu_initialization``) on both, then moved to the actor's device: the same seed then
gives the same version-0 weights on a CUDA cell and a CPU engine (CUDA's RNG would not).
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Protocol

import torch
from torch import nn

from actors.errors import PolicyError

__all__ = ["PolicySizes", "build_megatron_gpt", "default_group_backend",
           "ensure_megatron_parallel_state", "prepare_megatron_device"]


class PolicySizes(Protocol):
    """The sizes a GPT policy is built from (``actors.policies.policy.PolicyConfig`` has them)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_sequence_length: int


_MEGATRON_LOCK = threading.Lock()


def default_group_backend(cuda: bool | None = None) -> str:
    """The backend of this process's world of 1: ``"gloo"`` without CUDA, else NCCL for CUDA
    tensors and gloo for CPU ones. ``cuda`` None: whether torch sees CUDA here."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def ensure_megatron_parallel_state() -> None:
    """Initialise this process's megatron parallel state (TP = PP = 1) once.

    If ``torch.distributed`` is not initialised, creates a world of size 1 on a fresh file store
    (no port to collide with other processes), over :func:`default_group_backend`. Safe to call repeatedly and from threads.

    Raises:
        PolicyError: ``torch.distributed`` is already initialised with a world size other than
            1 (megatron's groups would then span foreign processes).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    with _MEGATRON_LOCK:
        if not dist.is_initialized():
            handle, path = tempfile.mkstemp(prefix="rl-ledger-megatron-")
            os.close(handle)
            os.unlink(path)
            dist.init_process_group(default_group_backend(), init_method=f"file://{path}",
                                    rank=0, world_size=1)
        if dist.get_world_size() != 1:
            raise PolicyError(
                f"megatron policy needs a torch.distributed world of 1 per process, "
                f"found {dist.get_world_size()}"
            )
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=1, pipeline_model_parallel_size=1
            )


def prepare_megatron_device(seed: int) -> str:
    """Set megatron-core 0.16 up for this process's device; returns "cuda" or "cpu".

    With CUDA: no patch; megatron's CUDA RNG tracker is seeded with ``seed`` (its attention
    forks it around dropout, so an unseeded tracker raises). Without CUDA, a patch: megatron
    allocates some tensors with ``device=torch.cuda.current_device()``, which raises on a
    CPU-only torch build, and its default RNG tracker forks CUDA RNG state; so
    ``current_device`` answers ``"cpu"`` and the tracker is the no-op inference tracker
    (dropout is 0 in our configs, so no model-parallel RNG is needed).
    """
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if torch.cuda.is_available():
        model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
        return "cuda"
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
    return "cpu"


_MEGATRON_CLASS: type[nn.Module] | None = None


def _megatron_causal_lm_class() -> type[nn.Module]:
    """A ``GPTModel`` subclass called as ``model(tokens) -> logits`` (built lazily: the import
    of megatron takes seconds and the twin must not need it)."""
    global _MEGATRON_CLASS
    if _MEGATRON_CLASS is None:
        from megatron.core.models.gpt.gpt_model import GPTModel

        class MegatronCausalLM(GPTModel):
            """megatron-core GPTModel with learned absolute positions and a causal mask."""

            backend = "megatron"

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                batch, seq = tokens.shape
                positions = torch.arange(seq, device=tokens.device).unsqueeze(0).expand(batch, seq)
                # An explicit mask (True = hidden): megatron's default causal mask is built
                # with device="cuda" hard-coded.
                mask = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).triu(1)
                return super().forward(tokens, positions, attention_mask=mask.view(1, 1, seq, seq))

        _MEGATRON_CLASS = MegatronCausalLM
    return _MEGATRON_CLASS


def build_megatron_gpt(config: PolicySizes, seed: int, init_std: float) -> nn.Module:
    """A megatron-core ``GPTModel`` of ``config``'s sizes, built on the CPU (the caller moves
    it to its device), called as ``model(tokens) -> logits`` (initialised from the current
    torch RNG).

    Raises:
        PolicyError: a foreign ``torch.distributed`` world (see
            :func:`ensure_megatron_parallel_state`).
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        ensure_megatron_parallel_state()
        prepare_megatron_device(seed)
        transformer_config = TransformerConfig(
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            ffn_hidden_size=config.ffn_hidden_size,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            use_cpu_initialization=True,
            init_method_std=init_std,
            params_dtype=torch.float32,
            pipeline_dtype=torch.float32,
        )
        model = _megatron_causal_lm_class()(
            config=transformer_config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=config.vocab_size,
            max_sequence_length=config.max_sequence_length,
            position_embedding_type="learned_absolute",
            share_embeddings_and_output_weights=False,
        )
    return model
