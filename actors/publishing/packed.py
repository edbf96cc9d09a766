"""Named tensors packed into one byte buffer, so a publish is one zero-copy object.

Ray stores a numpy array out of band and hands every reader a view of the shared memory,
but a ``dict[str, Tensor]`` goes through pickle tensor by tensor: about 5 ms to put and
2 ms to get for the built-in policy's 29 tensors, on every engine, every step. Packed, the
put and the get are one buffer each; the engine copies it once (a tensor must not alias the
read-only object store) and views every tensor in that copy.

The tensors' bytes are unchanged, so :func:`actors.publishing.weight_sync.tensors_checksum`
of the unpacked tensors equals the sender's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PackedTensors", "pack_tensors", "unpack_tensors"]

_ALIGN = 64  # every tensor starts on a 64-byte boundary, so its dtype view is aligned


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PackedTensors:
    """CPU tensors in one ``uint8`` numpy buffer, and the entry of each (name order)."""

    buffer: np.ndarray
    entries: tuple[TensorEntry, ...]


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def pack_tensors(tensors: dict[str, torch.Tensor]) -> PackedTensors:
    """Copy ``tensors`` (CPU, any dtype) into one buffer, in name order.

    Raises:
        ValueError: a tensor is not on the CPU.
    """
    off_cpu = [name for name, tensor in tensors.items() if tensor.device.type != "cpu"]
    if off_cpu:
        raise ValueError(f"only CPU tensors can be packed; not on the CPU: {off_cpu[:4]}")
    entries = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(TensorEntry(name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
        offset = _aligned(offset + nbytes)
    buffer = np.zeros(offset, dtype=np.uint8)  # padding included: the same tensors, the same bytes
    flat = torch.from_numpy(buffer)
    for entry in entries:
        if entry.nbytes:
            source = tensors[entry.name].detach().contiguous().reshape(-1).view(torch.uint8)
            flat[entry.offset:entry.offset + entry.nbytes].copy_(source)
    return PackedTensors(buffer, tuple(entries))


def unpack_tensors(packed: PackedTensors) -> dict[str, torch.Tensor]:
    """The tensors of ``packed``, as views of one private copy of its buffer (writable, so
    nothing aliases the read-only object store)."""
    if packed.buffer.size:
        flat = torch.frombuffer(bytearray(memoryview(packed.buffer)), dtype=torch.uint8)
    else:
        flat = torch.empty(0, dtype=torch.uint8)
    tensors = {}
    for entry in packed.entries:
        raw = flat[entry.offset:entry.offset + entry.nbytes]
        tensors[entry.name] = raw.view(entry.dtype).reshape(entry.shape)
    return tensors
