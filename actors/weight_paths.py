"""Which way a publish's tensors travel to the engines: the object store, or CUDA IPC.

The path changes only how the tensors reach each engine's ``load_weights``; the sequence
around it (``weight_update_started``, pause under the epoch fence, transfer, every engine's
checksum equal to the sender's, ``commit_weights``, the one finalize that stamps and resumes)
is the same code for both (:mod:`actors.publishing.weight_sync`).

- ``object_store`` (always available): one ``ray.put`` of CPU copies packed into one buffer
  (:mod:`actors.publishing.packed`), read by every engine.
- ``cuda_ipc``: chosen automatically when the publisher is on CUDA and every engine is an
  actor on the same node and the same physical GPU (fractional GPUs: a cell and its engines
  sharing one device). The publisher sends CUDA IPC handles of its staged tensors
  (``torch.multiprocessing.reductions.reduce_tensor``, the route verl and slime take for
  colocated engines); each engine opens them on its own CUDA device and copies from them: the
  built-in engine device to device; a vLLM engine keeps its logical weights on the CPU, so it
  copies them to the host once, but nothing goes through the object store. The publisher keeps the tensors alive until every engine has
  answered (:class:`~actors.publishing.weight_sync.StagedWeights` holds them).

An NCCL broadcast from the publisher to engines on other GPUs is not implemented: across GPUs
the object-store path is used.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from actors.cluster.node_info import node_fields
from actors.publishing.packed import PackedTensors, unpack_tensors

__all__ = ["CUDA_IPC", "OBJECT_STORE", "CudaIpcWeights", "DeviceInfo", "EngineDevices",
           "local_device_info", "open_weights", "select_weight_path", "share_cuda_tensors"]

logger = logging.getLogger(__name__)

OBJECT_STORE = "object_store"
CUDA_IPC = "cuda_ipc"
_STORAGE_DEVICE_ARG = 6  # in reduce_tensor's rebuild arguments of a CUDA tensor


@dataclass(frozen=True)
class DeviceInfo:
    """Where an actor computes: its Ray node, "cpu" or "cuda", and its GPU's UUID."""

    node_id: str
    device: str
    gpu_uuid: str | None = None


def local_device_info(device: str | torch.device) -> DeviceInfo:
    """This process's :class:`DeviceInfo` for tensors on ``device``."""
    device = torch.device(device)
    node_id = node_fields().get("node_id", "")
    if device.type != "cuda":
        return DeviceInfo(node_id, "cpu")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceInfo(node_id, "cuda", str(torch.cuda.get_device_properties(index).uuid))


def select_weight_path(publisher: DeviceInfo, engines: Sequence[DeviceInfo | None]) -> str:
    """``cuda_ipc`` when the publisher and every engine share one node and one GPU, else
    ``object_store`` (an engine that did not say where it runs, or a plain object, is None)."""
    if publisher.device != "cuda" or publisher.gpu_uuid is None or not engines:
        return OBJECT_STORE
    shared = all(engine is not None and engine.device == "cuda"
                 and engine.node_id == publisher.node_id
                 and engine.gpu_uuid == publisher.gpu_uuid for engine in engines)
    return CUDA_IPC if shared else OBJECT_STORE


def _engine_device(engine: Any) -> DeviceInfo:
    """Runs inside an engine actor (through ``__ray_call__``): where it computes."""
    return local_device_info(getattr(engine, "device", "cpu"))


class EngineDevices:
    """Engine actor -> its :class:`DeviceInfo`, asked once per actor (a replaced engine is a
    new actor)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._known: dict[str, DeviceInfo] = {}

    def of(self, engines: Sequence[Any]) -> list[DeviceInfo | None]:
        """One entry per engine: its device, or None (a plain object, or no answer)."""
        actor_ids = [getattr(engine, "_actor_id", None) for engine in engines]
        asked = {actor_id.hex(): engine.__ray_call__.remote(_engine_device)
                 for actor_id, engine in zip(actor_ids, engines)
                 if actor_id is not None and actor_id.hex() not in self._known}
        for key, ref in asked.items():
            try:
                self._known[key] = ray.get(ref, timeout=self.timeout_s)
            except Exception:  # noqa: BLE001 - a dead engine fails its transfer anyway
                logger.debug("engine actor %s did not say its device", key, exc_info=True)
        return [self._known.get(a.hex()) if a is not None else None for a in actor_ids]


@dataclass(frozen=True)
class CudaIpcWeights:
    """CUDA IPC handles of named tensors: ``name -> (rebuild function, its arguments)``."""

    handles: dict[str, tuple[Any, tuple[Any, ...]]]


def share_cuda_tensors(tensors: dict[str, torch.Tensor]) -> CudaIpcWeights:
    """IPC handles of ``tensors`` (all on CUDA); the caller keeps them alive until every
    receiver has copied from them.

    Raises:
        ValueError: a tensor is not on CUDA.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    off = [name for name, tensor in tensors.items() if tensor.device.type != "cuda"]
    if off:
        raise ValueError(f"CUDA IPC needs CUDA tensors; not on CUDA: {off[:4]}")
    return CudaIpcWeights({name: reduce_tensor(tensor.detach().contiguous())
                           for name, tensor in tensors.items()})


def open_weights(payload: dict[str, torch.Tensor] | PackedTensors | CudaIpcWeights
                 ) -> dict[str, torch.Tensor]:
    """The tensors a ``load_weights`` call received: ``payload`` itself, the tensors of a
    packed object-store buffer, or the publisher's CUDA tensors opened from their IPC handles
    on this process's current CUDA device (the sender's device index means nothing here: each
    actor numbers its visible GPUs from 0)."""
    if isinstance(payload, PackedTensors):
        return unpack_tensors(payload)
    if not isinstance(payload, CudaIpcWeights):
        return payload
    here = torch.cuda.current_device()
    opened = {}
    for name, (rebuild, arguments) in payload.handles.items():
        arguments = list(arguments)
        arguments[_STORAGE_DEVICE_ARG] = here
        opened[name] = rebuild(*arguments)
    return opened
