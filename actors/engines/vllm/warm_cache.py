"""Warm vLLM's model-inspection cache once, when vLLM is installed (``make install-vllm``).

Before an engine builds its model, vLLM inspects the model's architecture class in a fresh
subprocess (so that the parent never initialises CUDA): it imports vLLM and the model's module
again, about 13 CPU-seconds on the 2-core machine this was measured on, and caches the answer
under ``VLLM_CACHE_ROOT/modelinfos``. With a cold cache, every engine of a run's first start
pays that, all at once. Running the same inspection here, through vLLM's public
``EngineArgs.create_model_config`` on the task's tiny Llama, moves the cost to the install.

``python -m actors.engines.vllm.warm_cache`` prints one line and exits 0; it exits 1 with the
reason if vLLM cannot inspect the model (a broken install is better found here than in a run).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from actors.engines.vllm.args import DEFAULT_KV_CACHE_BYTES, VLLM_ENVIRONMENT, engine_arguments

__all__ = ["warm_model_inspection"]


def warm_model_inspection(work_dir: Path) -> str:
    """Inspect the task's Llama (made under ``work_dir``) the way an engine does, filling
    vLLM's cache; return the architecture vLLM resolved.

    Raises:
        Exception: whatever vLLM raises when it cannot inspect the model.
    """
    os.environ.update(VLLM_ENVIRONMENT)  # as an engine actor sets it, before vLLM loads
    from vllm.engine.arg_utils import EngineArgs

    from actors.policies.hf_policy import TinyLlamaSizes, ensure_task_model
    from actors.task import TOKENIZER

    model = ensure_task_model(work_dir / "model", TOKENIZER.symbols, seed=0)
    arguments = engine_arguments(str(model), seed=0,
                                 max_model_len=TinyLlamaSizes().max_position_embeddings,
                                 kv_cache_bytes=DEFAULT_KV_CACHE_BYTES)
    return EngineArgs(**arguments).create_model_config().architecture


def main() -> int:
    """Warm the cache in a scratch directory; one line either way."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # an install step, not a run
    with tempfile.TemporaryDirectory(prefix="rl-ledger-vllm-warm-") as scratch:
        try:
            architecture = warm_model_inspection(Path(scratch))
        except Exception as exc:  # noqa: BLE001 - reported in one line, the install decides
            print(f"vLLM could not inspect the task model: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 1
    print(f"vLLM's model-inspection cache is warm for {architecture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
