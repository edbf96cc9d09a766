"""Ray details behind small ``create_*`` helpers: the cluster, engines, cells, the manager.

Everything a run allocates is built from its :class:`RunConfig`, so a replacement actor (a
healed cell, a restarted engine or manager) is built exactly like the original.

Where an actor goes is decided by the placement (:mod:`orchestrator.control.placement.placer`),
which calls a factory inside :func:`scheduled`; ``create_cell`` and ``create_engine`` add the
decided ``scheduling_strategy`` to their actor options (a factory of your own can read
:func:`scheduling_options` too, or ignore it and be scheduled by Ray's default). The rollout
manager goes to the driver's node when it has room (it is lost with the driver anyway).

``init_ray`` without an address always starts a cluster of its own (``address="local"``),
whatever ``ray start`` cluster runs, or ran, on the machine, without the helpers it does not use
(:mod:`orchestrator.control.lean_ray`); with an address it joins and never
passes resources (the cluster has its own). A local cluster counts this machine's GPUs itself
(Ray's detection): that resource view is what ``--device auto`` and the default GPU shares are
decided from (:func:`resolve_devices`), and each cell and engine asks for its GPUs
(``num_gpus``) on top of its CPUs.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from actors.startup_gc import settle_after_start
from actors.transport import Transport
from orchestrator.config import RunConfig
from orchestrator.control.lean_ray import FULL_RAY_ENV, start_local_ray
from orchestrator.control.placement import devices
from orchestrator.errors import StartupError
from orchestrator.control.task_setup import run_task

__all__ = [
    "ActorBudget",
    "StartupError",
    "check_cluster_ledger",
    "check_cpu_budget",
    "check_gpu_budget",
    "create_cell",
    "create_engine",
    "create_rollout_manager",
    "init_ray",
    "policy_config",
    "preload_in_background",
    "resolve_devices",
    "role_resources",
    "scheduled",
    "scheduling_options",
    "task_for",
]

CELL_CPUS = 0.25
ENGINE_CPUS = 0.25
MANAGER_CPUS = 0.1
ROLE_CPUS = {"cell": CELL_CPUS, "engine": ENGINE_CPUS}

# The scheduling decided for the actor being created (set by the placement, for one call).
_SCHEDULING: ContextVar[dict[str, Any] | None] = ContextVar("rl_ledger_scheduling", default=None)


@contextmanager
def scheduled(strategy: Any) -> Iterator[None]:
    """Actors created by ``create_cell`` / ``create_engine`` in this block use ``strategy`` (a
    Ray scheduling strategy: placement-group bundle or node affinity)."""
    token = _SCHEDULING.set({"scheduling_strategy": strategy})
    try:
        yield
    finally:
        _SCHEDULING.reset(token)


def scheduling_options() -> dict[str, Any]:
    """The actor options of the placement decided for the actor being created; ``{}`` when
    none was (Ray's default scheduling)."""
    return dict(_SCHEDULING.get() or {})


@dataclass(frozen=True)
class ActorBudget:
    """The CPUs a run's actors ask Ray for."""

    cells: int
    engines: int

    @property
    def cpus(self) -> float:
        return self.cells * CELL_CPUS + self.engines * ENGINE_CPUS + MANAGER_CPUS


def init_ray(config: RunConfig, address: str | None = None) -> None:
    """Start a local Ray cluster sized to this machine, or join ``address``.

    Raises:
        StartupError: the cluster has fewer CPUs than the run's actors need, or cannot be
            started or reached.
    """
    import ray

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    budget = ActorBudget(config.num_cells, config.num_engines)
    if not ray.is_initialized():
        try:
            if address is None:  # our own cluster, whatever else runs on the machine
                start_local_ray(num_cpus=os.cpu_count() or 1)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            if address is None:
                raise StartupError(f"cannot start a local Ray cluster: {exc} ({FULL_RAY_ENV}=1 "
                                   "starts it with all of Ray's helpers)") from None
            raise StartupError(f"cannot join the Ray cluster at {address}: {exc}") from None
    _check_budget(budget, float(ray.cluster_resources().get("CPU", 0.0)))


def preload_in_background(*modules: str) -> threading.Thread:
    """Start importing ``modules`` in a daemon thread and return it (join it before the
    process may exit: an import cut short at exit can crash the interpreter).

    The driver needs torch only to host the cells' rendezvous store, seconds after it starts;
    importing it (about 2 s of CPU) while ``ray.init`` waits on Ray's processes takes it off
    the start-up's critical path. An import that fails here is left for its real user to
    raise: this thread only warms the module cache.
    """

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the real import raises it, typed, where it counts
                return

    thread = threading.Thread(target=load, name="rl-ledger-preload", daemon=True)
    thread.start()
    return thread


def check_cluster_ledger(config: RunConfig, ledger_url: str, address: str | None = None) -> None:
    """Before anything is written: refuse a ledger URL the cluster's nodes cannot share, then
    (more than one node) open the ledger from every node
    (:mod:`orchestrator.control.placement.ledger_check`).

    Joins the cluster at ``address`` first (:func:`init_ray`); a cluster this job will start
    itself (no address, Ray not initialised) is this machine alone: nothing to check.

    Raises:
        StartupError: one line, "use a PostgreSQL URL reachable from every node"; or the
            cluster cannot be joined.
    """
    import ray

    from orchestrator.control.placement.ledger_check import (
        check_ledger_url,
        probe_ledger_from_every_node,
    )
    from orchestrator.control.placement.nodes import live_nodes

    if address is None and not ray.is_initialized():
        return
    init_ray(config, address)
    nodes = live_nodes()
    check_ledger_url(ledger_url, len(nodes), joined=address is not None)
    if len(nodes) > 1:
        probe_ledger_from_every_node(ledger_url, nodes=nodes)


def check_cpu_budget(config: RunConfig, address: str | None = None) -> None:
    """Fail fast, before anything is written, if the run's actors cannot fit.

    Checks against the running Ray cluster if there is one, else against this machine's CPUs
    (what a local cluster gets); a cluster to be joined at ``address`` is checked on joining.

    Raises:
        StartupError: the actors need more CPUs than there are.
    """
    import ray

    budget = ActorBudget(config.num_cells, config.num_engines)
    if ray.is_initialized():
        _check_budget(budget, float(ray.cluster_resources().get("CPU", 0.0)))
    elif address is None:
        _check_budget(budget, float(os.cpu_count() or 1))


def check_gpu_budget(config: RunConfig, address: str | None = None) -> None:
    """Fail fast, before anything is written, if a config that asks for GPUs outright
    (``--device cuda``, a GPU count) cannot get them: Ray is started (or joined) first, since
    only its resource view knows. Any other config is left to :func:`resolve_devices`, which
    cannot fail for it (and Ray is not started here).

    Raises:
        StartupError: as :func:`resolve_devices`; or the cluster cannot be joined.
    """
    if devices.asks_for_gpus(config):
        init_ray(config, address)
        resolve_devices(config)


def _check_budget(budget: ActorBudget, available: float) -> None:
    if budget.cpus > available:
        raise StartupError(
            f"{budget.cells} cells and {budget.engines} engines need {budget.cpus:g} CPUs "
            f"({CELL_CPUS:g} each, plus {MANAGER_CPUS:g} for the rollout manager); "
            f"the Ray cluster has {available:g}"
        )


def resolve_devices(config: RunConfig) -> RunConfig:
    """``config`` with its device, dtype and GPUs per actor decided for the connected Ray
    cluster (:func:`orchestrator.control.placement.devices.resolve_devices`); call after
    :func:`init_ray`, before any actor starts.

    Raises:
        StartupError: ``--device cuda`` without a GPU, or more GPUs asked for than there are.
    """
    return devices.resolve_devices(config, devices.cluster_gpus())


def role_resources(config: RunConfig, role: str) -> dict[str, float]:
    """The Ray resources one actor of ``role`` ("cell" or "engine") asks for: its placement
    bundle (``{"CPU": ..., "GPU": ...}``, no GPU key for a CPU actor)."""
    gpus = devices.gpus_of(config, role)
    return {"CPU": ROLE_CPUS[role], **({"GPU": gpus} if gpus > 0 else {})}


def task_for(config: RunConfig):
    """The engines' task of the run (:mod:`orchestrator.control.task_setup`): the built-in
    addition task seeded by the run's seed, or the data set's tokenizer and reward."""
    return run_task(config).engine_task


def policy_config(config: RunConfig):
    """The policy sizes every cell and engine of the run share (LoRA adapters, of the run's
    ``lora_rank`` and ``lora_alpha``, only with the ``lora`` transport): the task's
    vocabulary, and a context that holds its longest prompt plus ``max_response_len``."""
    from actors.policies.policy import PolicyConfig

    task = run_task(config)
    sizes = {"vocab_size": task.vocab_size, "max_sequence_length": task.max_sequence_length}
    if config.transport != Transport.LORA:
        return PolicyConfig(**sizes)
    return PolicyConfig(**sizes, lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)


def create_engine(config: RunConfig, engine_id: str):
    """A ``RolloutEngine`` actor with the run's policy, task, sampling parameters and pause
    mode (``partial_rollout``: in_place, else abort), on its GPUs and device
    (:mod:`orchestrator.control.placement.devices`); a ``VLLMEngine`` with ``--engine vllm``."""
    if config.engine == "vllm":
        from orchestrator.control.engine_pool.vllm_launch import create_vllm_engine

        return create_vllm_engine(config, engine_id, ENGINE_CPUS,
                                  **devices.gpu_options(config, "engine"), **scheduling_options())
    import ray

    from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine

    options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": ENGINE_CPUS,
               **devices.gpu_options(config, "engine"), **scheduling_options()}
    sampling = {
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_new_tokens": config.max_response_len,
    }
    return ray.remote(**options)(RolloutEngine).remote(
        engine_id, config.backend, policy_config(config), seed=config.seed,
        task=task_for(config), sampling=sampling, partial_rollout=config.partial_rollout,
        device=devices.actor_device(config, "engine"),
        dtype=devices.actor_dtype(config, "engine"),
    )


def create_cell(config: RunConfig, cell_id: str):
    """A ``TrainCell`` actor with the run's policy, optimizer and transport, bound to the
    run's ledger (``config.db``, ``config.run_id``) for publishing. The ``lora`` transport
    trains only the adapters, at ``lora_lr``. Its GPUs, device, dtype and gradient backend come
    from :mod:`orchestrator.control.placement.devices`. With ``--engine vllm``, a
    ``LlamaTrainCell``."""
    from actors.grpo import GRPOConfig

    objective = GRPOConfig(clip_low=config.eps_clip, clip_high=config.eps_clip_high,
                           dual_clip=config.eps_clip_c, temperature=config.temperature,
                           off_policy_correction=config.off_policy_correction,
                           tis_cap=config.tis_cap, tis_clip_low=config.tis_clip_low)
    # What every train cell takes, built-in or Llama.
    arguments = dict(
        seed=config.seed, transport=config.transport,
        learning_rate=config.lora_lr if config.transport == Transport.LORA else config.lr,
        grpo=objective, collective_timeout_s=config.heartbeat_timeout_s,
        ledger_url=config.db, run_id=config.run_id, **devices.cell_device_options(config),
    )
    if config.engine == "vllm":
        from orchestrator.control.engine_pool.vllm_launch import create_llama_cell

        return create_llama_cell(config, cell_id, CELL_CPUS, arguments,
                                 **devices.gpu_options(config, "cell"), **scheduling_options())
    import ray

    from actors.train_cell import TRAIN_CELL_ACTOR_OPTIONS, TrainCell

    options = {**TRAIN_CELL_ACTOR_OPTIONS, "num_cpus": CELL_CPUS,
               **devices.gpu_options(config, "cell"), **scheduling_options()}
    return ray.remote(**options)(TrainCell).remote(
        cell_id, config.backend, policy_config(config), **arguments)


def create_rollout_manager(config: RunConfig, ledger_url: str, run_id: str,
                           engines: dict[str, Any], scheduling_strategy: Any = None):
    """A ``RolloutManager`` actor over a ``RayEnginePool`` of ``engines``: with
    ``scheduling_strategy`` where it says, else on the driver's node if it has room (soft node
    affinity), else wherever Ray finds room."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.cluster.node_info import this_node_id
    from orchestrator.control.engine_pool.ray_pool import RayEnginePool
    from orchestrator.rollout.manager import RolloutManager

    make_prompt = run_task(config).make_prompt
    driver_node = NodeAffinitySchedulingStrategy(this_node_id(),
                                                 soft=True)
    options = {"num_cpus": MANAGER_CPUS,
               "scheduling_strategy": scheduling_strategy or driver_node}
    manager = ray.remote(**options)(RolloutManager).remote(
        ledger_url, run_id, config, make_prompt,
        RayEnginePool(engines, max_groups_per_call=config.engine_call_max_groups),
    )
    settle_after_start(manager)  # the rollout path may not import actors.startup_gc
    return manager


def _make_prompt(seed: int, index: int):
    from actors.task import AdditionTask

    return AdditionTask(seed=seed).make_prompt(index)
