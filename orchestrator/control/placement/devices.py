"""Devices of a run: what ``--device auto`` and unset GPU counts become on this Ray cluster,
and the GPUs each actor asks Ray for.

Resolution reads Ray's resource view (``ray.cluster_resources()["GPU"]``), never the driver's
own CUDA: on a cluster the driver may run on a machine without a GPU. The rules:

- ``device``: ``auto`` is ``cuda`` when the cluster reports a GPU, else ``cpu``; ``cuda`` on a
  cluster without one is refused (:class:`StartupError`, before the ledger is written).
- ``dtype``: ``auto`` is ``bfloat16`` on cuda, ``float32`` on cpu.
- GPUs per cell and per engine: 0 on cpu. On cuda, unset counts get the default share: 1 when
  the cluster has a GPU for every cell and engine, else ``1/k`` of a GPU with ``k`` the actors
  per GPU (``ceil(actors / gpus)``): a fractional request must fit on one GPU, so an equal
  ``gpus / actors`` split (0.66 on 2 GPUs for 3 actors) would not place. A 1-GPU machine thus
  holds 2 cells and 1 engine at 1/3 each. The total asked must fit the cluster.
- An actor computes on CUDA exactly when it asks Ray for a GPU (Ray then sets its
  ``CUDA_VISIBLE_DEVICES``); ``--gpus-per-engine 0`` on cuda keeps engines on CPU.
- vLLM's ``gpu_memory_utilization``: 0.9 x the engine's GPU share unless given.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.errors import StartupError

__all__ = ["actor_device", "actor_dtype", "asks_for_gpus", "cell_device_options", "cluster_gpus",
           "default_gpu_share", "gpu_options", "gpus_of", "resolve_devices"]

_ROLE_FIELD = {"cell": "gpus_per_cell", "engine": "gpus_per_engine"}
_SHARE_DECIMALS = 4  # Ray keeps resources to 1/10000


def cluster_gpus() -> float:
    """The GPUs the connected Ray cluster reports (0 when it has none)."""
    import ray

    return float(ray.cluster_resources().get("GPU", 0.0))


def default_gpu_share(gpus: float, actors: int) -> float:
    """GPUs per actor when ``actors`` share ``gpus`` and none was given (module docstring)."""
    if gpus <= 0 or actors < 1:
        return 0.0
    if gpus >= actors:
        return 1.0
    per_gpu = math.ceil(actors / math.floor(gpus)) if gpus >= 1 else actors
    share = (gpus if gpus < 1 else 1.0) / per_gpu
    return math.floor(share * 10**_SHARE_DECIMALS) / 10**_SHARE_DECIMALS


def resolve_devices(config: RunConfig, gpus: float) -> RunConfig:
    """``config`` with ``device``, ``dtype``, the GPU counts and (on cuda) vLLM's memory share
    decided for a cluster of ``gpus`` GPUs (the rules of the module docstring).

    Raises:
        StartupError: ``--device cuda`` without a GPU in the cluster, or more GPUs asked for
            than the cluster has; one line naming the option.
    """
    device = config.device
    if device == "auto":
        device = "cuda" if gpus > 0 else "cpu"
    if device == "cuda" and gpus <= 0:
        raise StartupError("device: --device cuda but the Ray cluster reports no GPU "
                           "(use --device auto or cpu)")
    if device == "cpu" and (config.gpus_per_cell or config.gpus_per_engine):
        raise StartupError("gpus_per_cell: GPUs per cell or engine were asked for but the Ray "
                           "cluster reports no GPU")
    dtype = config.dtype if config.dtype != "auto" else (
        "bfloat16" if device == "cuda" else "float32")
    if device == "cpu":
        return config.model_copy(update={"device": "cpu", "dtype": dtype,
                                         "gpus_per_cell": 0.0, "gpus_per_engine": 0.0})
    share = default_gpu_share(gpus, config.num_cells + config.num_engines)
    per_cell = share if config.gpus_per_cell is None else float(config.gpus_per_cell)
    per_engine = share if config.gpus_per_engine is None else float(config.gpus_per_engine)
    asked = config.num_cells * per_cell + config.num_engines * per_engine
    if asked > gpus + 1e-9:
        raise StartupError(
            f"gpus_per_cell: {config.num_cells} cells x {per_cell:g} GPU and "
            f"{config.num_engines} engines x {per_engine:g} GPU need {asked:g} GPUs; "
            f"the Ray cluster has {gpus:g}")
    memory = config.gpu_memory_utilization
    if memory is None and per_engine > 0:
        memory = round(0.9 * min(1.0, per_engine), 3)
    return config.model_copy(update={
        "device": "cuda", "dtype": dtype, "gpus_per_cell": per_cell,
        "gpus_per_engine": per_engine, "gpu_memory_utilization": memory,
    })


def asks_for_gpus(config: RunConfig) -> bool:
    """Whether ``config`` says GPUs outright (``--device cuda`` or a GPU count above 0): the
    only configs whose resolution can fail, so the only ones checked before anything is
    written (:func:`orchestrator.control.launch.check_gpu_budget`)."""
    return config.device == "cuda" or bool(config.gpus_per_cell or config.gpus_per_engine)


def gpus_of(config: RunConfig, role: str) -> float:
    """The GPUs one actor of ``role`` ("cell" or "engine") asks Ray for (0 if unresolved)."""
    return float(getattr(config, _ROLE_FIELD[role]) or 0.0)


def gpu_options(config: RunConfig, role: str) -> dict[str, float]:
    """Ray actor options for the GPUs of ``role``: ``{"num_gpus": n}``, or ``{}`` for none
    (a CPU actor's options stay exactly what they were)."""
    gpus = gpus_of(config, role)
    return {"num_gpus": gpus} if gpus > 0 else {}


def actor_device(config: RunConfig, role: str) -> str:
    """"cuda" if an actor of ``role`` is given a GPU, else "cpu"."""
    return "cuda" if gpus_of(config, role) > 0 else "cpu"


def actor_dtype(config: RunConfig, role: str) -> str:
    """The dtype name an actor of ``role`` computes in (an unresolved ``auto``: its device's)."""
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if actor_device(config, role) == "cuda" else "float32"


def cell_device_options(config: RunConfig) -> dict[str, Any]:
    """A train cell's device keyword arguments: its device, dtype and gradient backend (NCCL
    when each cell has a GPU of its own, else gloo: :func:`actors.gradient_group.gradient_backend`).
    """
    from actors.gradient_group import gradient_backend

    device = actor_device(config, "cell")
    return {"device": device, "dtype": actor_dtype(config, "cell"),
            "gradient_backend": gradient_backend(device, gpus_of(config, "cell"))}
