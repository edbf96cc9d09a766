"""The device an actor computes on, its compute dtype, and moving state to and from it.

The control plane decides per actor (``orchestrator.control.placement.devices``): an actor given
a GPU by Ray computes on ``"cuda"``, any other on ``"cpu"``. Ray sets the actor's
``CUDA_VISIBLE_DEVICES`` to the GPU it was given, so inside the actor that GPU is CUDA device
0 of the visible ones (with a fractional GPU, several actors see the same device 0).

Dtype: a train cell keeps float32 master weights and optimizer state and runs its forward and
backward under ``torch.autocast`` in the compute dtype (bf16 on CUDA: the loss and the
optimizer step stay float32, as in megatron's and miles' mixed precision); an engine holds its
weights in the compute dtype. ``float32`` means no autocast at all: CPU runs are unchanged.

What crosses a process or a file (a cell's state for healing, a checkpoint, weights in the
object store) is always on the CPU (:func:`cpu_copy`), so a state written by a CUDA cell
loads in a CPU cell and the other way round; loading moves it to the receiver's device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from actors.errors import DeviceError

__all__ = ["DTYPES", "DeviceError", "autocast", "cpu_copy", "select_device", "torch_dtype"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def select_device(name: str) -> torch.device:
    """The torch device of an actor told to compute on ``name`` ("cpu" or "cuda").

    Raises:
        DeviceError: "cuda" but torch sees no CUDA device (a CPU build of torch, or Ray gave
            this actor no GPU).
        ValueError: another name.
    """
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda":
        raise ValueError(f"unknown device {name!r}; expected 'cpu' or 'cuda'")
    if not torch.cuda.is_available():
        raise DeviceError("this actor was placed on a GPU but torch sees no CUDA device: "
                          "install the CUDA build of torch (make install-gpu)")
    index = torch.cuda.current_device()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name`` ("float32" or "bfloat16").

    Raises:
        ValueError: another name.
    """
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Run the block under ``torch.autocast(device, dtype)``; a no-op for float32."""
    if dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def cpu_copy(value: Any) -> Any:
    """A copy of ``value`` (tensors, and dicts, lists and tuples of them, as in a state dict)
    whose tensors are detached CPU copies that share nothing with the originals. Other leaves
    (numbers, strings, None) are immutable and kept as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cpu_copy(item) for item in value)
    return value
