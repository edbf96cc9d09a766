"""Ray details of ``--engine vllm``: the run's Llama, vLLM engine actors, Llama train cells.

:mod:`orchestrator.control.launch` dispatches here when ``config.engine == "vllm"``. Every
engine and cell of such a run is built from one local ``save_pretrained`` directory,
``config.model``, which :func:`plan_model` fixes before anything starts: the user's
directory, or a tiny random Llama and tokenizer for the task made under the run directory
(cached: a resumed run finds the same model), which the driver makes while Ray starts
(:meth:`ModelPlan.make`). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.errors import PolicyError
from actors.policies.task_vocabulary import check_task_vocabulary
from actors.transport import Transport
from orchestrator.config import RunConfig
from orchestrator.control.placement import devices
from orchestrator.errors import StartupError

__all__ = ["MODEL_DIR_NAME", "ModelPlan", "create_llama_cell", "create_vllm_engine",
           "llama_policy", "plan_model", "resolve_model"]

MODEL_DIR_NAME = "model"


@dataclass(frozen=True)
class ModelPlan:
    """Where the run's Llama is, from :func:`plan_model`.

    Attributes:
        config: the run's config with ``model`` set to the absolute directory every actor loads.
        to_make: the recipe of the tiny task model to make there, or ``None`` when the directory
            is the user's (``--model``, already checked) or the run is not a vLLM run.
    """

    config: RunConfig
    to_make: tuple[Path, int] | None = None

    def make(self) -> None:
        """Make the task model the plan names (seconds: torch and ``transformers`` load), and
        check that it speaks the task; nothing when there is none to make.

        Raises:
            StartupError: the directory holds a model made from other parameters.
        """
        if self.to_make is None:
            return
        from actors.policies.hf_policy import ensure_task_model
        from actors.task import TOKENIZER

        directory, seed = self.to_make
        try:
            made = ensure_task_model(directory, TOKENIZER.symbols, seed=seed)
        except PolicyError as exc:
            raise StartupError(str(exc)) from None
        _require_task_vocabulary(made)


def plan_model(config: RunConfig, run_dir: Path) -> ModelPlan:
    """Decide which directory the run's engines and cells load, checking what is cheap to check.

    Unchanged for the built-in engine. Otherwise checks that vLLM is installed; a ``--model``
    directory must speak the task's symbols (read from its ``tokenizer.json``, without torch);
    with no ``--model``, the task model to make under ``run_dir/model`` is left to
    :meth:`ModelPlan.make`, which the driver runs while Ray starts.

    Raises:
        StartupError: vLLM is not installed, or the model cannot serve the task.
    """
    if config.engine != "vllm":
        return ModelPlan(config)
    if importlib.util.find_spec("vllm") is None:
        raise StartupError("--engine vllm needs vLLM: pip install -e '.[vllm]' "
                           "(make install-vllm does it with the CPU torch)")
    if config.model is None:  # never with a data set: RunConfig requires --model there
        model_dir = (run_dir / MODEL_DIR_NAME).resolve()
        return ModelPlan(config.model_copy(update={"model": str(model_dir)}),
                         to_make=(model_dir, config.seed))
    if not config.prompt_data:  # a data-set task reads the model's own tokenizer
        _require_task_vocabulary(config.model)
    return ModelPlan(config.model_copy(update={"model": str(Path(config.model).resolve())}))


def _require_task_vocabulary(model_dir: str | Path) -> None:
    """The addition task's check of a model's tokenizer, as a one-line start-up error."""
    from actors.task import TOKENIZER

    try:
        check_task_vocabulary(model_dir, TOKENIZER.symbols)
    except PolicyError as exc:
        raise StartupError(str(exc)) from None


def resolve_model(config: RunConfig, run_dir: Path) -> RunConfig:
    """The config with ``model`` set to the absolute directory every actor loads, the task
    model made there when no ``--model`` was given: :func:`plan_model` and
    :meth:`ModelPlan.make` in one call, for a job built without the driver's overlap.

    Raises:
        StartupError: vLLM is not installed, or the model cannot serve the task.
    """
    plan = plan_model(config, run_dir)
    plan.make()
    return plan.config


def llama_policy(config: RunConfig):
    """The Llama every cell and engine of the run builds (LoRA only with ``lora``).

    Raises:
        StartupError: ``config.model`` is not set (call :func:`resolve_model` first).
    """
    from actors.policies.hf_policy import HFPolicyConfig

    if config.model is None:
        raise StartupError("no model directory: resolve_model() must run before actors start")
    rank = config.lora_rank if config.transport == Transport.LORA else 0
    return HFPolicyConfig(model_dir=config.model, lora_rank=rank, lora_alpha=config.lora_alpha)


def create_vllm_engine(config: RunConfig, engine_id: str, num_cpus: float,
                       **actor_options: Any):
    """A ``VLLMEngine`` actor with the run's model, task, sampling and pause mode, on its
    device and dtype with the run's ``gpu_memory_utilization`` (``actor_options`` carry its
    ``num_gpus``)."""
    import ray

    from actors.engines.vllm.engine import VLLM_ENGINE_ACTOR_OPTIONS, VLLMEngine
    from orchestrator.control.task_setup import run_task

    options = {**VLLM_ENGINE_ACTOR_OPTIONS, "num_cpus": num_cpus, **actor_options}
    sampling = {"temperature": config.temperature, "top_p": config.top_p,
                "max_new_tokens": config.max_response_len}
    return ray.remote(**options)(VLLMEngine).remote(
        engine_id, llama_policy(config), seed=config.seed, task=run_task(config).engine_task,
        sampling=sampling, partial_rollout=config.partial_rollout,
        device=devices.actor_device(config, "engine"),
        dtype=devices.actor_dtype(config, "engine"),
        gpu_memory_utilization=config.gpu_memory_utilization,
    )


def create_llama_cell(config: RunConfig, cell_id: str, num_cpus: float,
                      cell_arguments: dict[str, Any], **actor_options: Any):
    """A ``LlamaTrainCell`` actor (``hf`` or ``megatron`` backend) over the run's HF Llama,
    with the keyword arguments every train cell takes (``launch.create_cell``: seed,
    optimizer, objective, ledger, devices)."""
    import ray

    from actors.llama_cell import LLAMA_CELL_ACTOR_OPTIONS, LlamaTrainCell

    options = {**LLAMA_CELL_ACTOR_OPTIONS, "num_cpus": num_cpus, **actor_options}
    return ray.remote(**options)(LlamaTrainCell).remote(
        cell_id, config.backend, llama_policy(config), **cell_arguments)
