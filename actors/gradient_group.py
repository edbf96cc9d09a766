"""The cells' gradient group: gloo or NCCL, re-formed per quorum, and its rendezvous store.

Backend (:func:`gradient_backend`, decided by the control plane and recorded in every
``cell_state``): **NCCL** when the cells compute on CUDA and each has a GPU of its own
(``gpus_per_cell >= 1``); **gloo** when they run on CPU or share a GPU (NCCL refuses two
ranks on one device). Both are torchft's reconfigurable groups, configured with the same fresh
store prefix per quorum id, so re-forming a quorum after a failover is the same call for
both. Over gloo, CUDA gradients are all-reduced through a CPU copy (the group's backend is
registered for CPU tensors); over NCCL they stay on the GPU.

Mechanism, chosen after trying both on this CPU-only machine: **torchft's reconfigurable
``ProcessGroupGloo``** (torchft 0.2). It works on CPU, creates its gloo backend on a
``PrefixStore`` over a TCP store without touching ``torch.distributed``'s default group (which
megatron's parallel state already owns as a world of 1 per process), and a re-configure with a
fresh prefix per quorum id tears down the old group. The store is hosted by the control plane
(:func:`create_rendezvous_store`).

Across machines two addresses must be routable, not loopback:

- the **store**'s, which the control plane advertises to every cell: the driver node's Ray IP
  (``ray.util.get_node_ip_address()``), or an explicit host (``--rendezvous-host``);
- each cell's own **gloo device**, which gloo publishes in the store for its peers to connect
  to. torch binds it to whatever the machine's hostname resolves to, which is often
  ``127.0.0.1`` (``/etc/hosts``) and then unreachable from other machines. A cell therefore
  binds its device to the local address it reaches the store from (a UDP ``connect`` toward
  the store, which sends nothing): the interface peers can route back to. ``GLOO_SOCKET_IFNAME``,
  when set, still wins (torch's own way to pick an interface).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from actors.errors import CollectiveError

if TYPE_CHECKING:
    import torch

# torch is imported where it is used: the driver imports this module for the gradient backend
# rule at start-up, before it needs torch (for the store), and must not wait seconds for it.

__all__ = ["GRADIENT_BACKENDS", "GradientGroup", "create_rendezvous_store", "gradient_backend",
           "local_address_towards", "routable_address"]

logger = logging.getLogger(__name__)

GRADIENT_BACKENDS: tuple[str, ...] = ("gloo", "nccl")


def gradient_backend(device: str, gpus_per_cell: float) -> str:
    """"nccl" when cells compute on CUDA with a whole GPU each, else "gloo" (module docstring).
    """
    return "nccl" if device == "cuda" and gpus_per_cell >= 1 else "gloo"


def routable_address() -> str:
    """The address other nodes reach this process's node on: the Ray node IP when this process
    is connected to Ray, else the source address of the default route (Ray's own probe)."""
    import ray

    return ray.util.get_node_ip_address()


def local_address_towards(host: str, port: int) -> str:
    """The local address this process uses to reach ``host:port``: the one a peer there can
    route back to. A UDP ``connect`` picks the route and sends nothing; ``127.0.0.1`` if the
    route cannot be determined.
    """
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, port))
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def create_rendezvous_store(host: str | None = None, port: int = 0) -> tuple[Any, str]:
    """Host the TCP store that cells rendezvous on; returns ``(store, "host:port")``.

    The store listens on every interface; ``host`` is the address it is advertised under, so
    it must be one every cell can route to: by default :func:`routable_address` (the driver
    node's Ray IP), never loopback on a multi-node cluster. Keep the returned store object
    alive for as long as groups are formed (it is the server). ``port=0`` picks a free port.
    """
    from torch.distributed import TCPStore

    host = host or routable_address()
    store = TCPStore(host, port, is_master=True, wait_for_workers=False)
    return store, f"{host}:{store.port}"


def _split_store_addr(store_addr: str) -> tuple[str, int]:
    host, _, port = store_addr.rpartition(":")
    return host.strip("[]"), int(port)


def _routable_gloo(timeout: timedelta, device_host: str | None) -> Any:
    """torchft's reconfigurable gloo group, with its device bound to ``device_host``.

    torchft builds ``ProcessGroupGloo(store, rank, size, timeout)``, whose device is bound to
    the hostname's address; the override below is that same construction with an explicit
    device (``None``: torch's default, e.g. when ``GLOO_SOCKET_IFNAME`` is set).
    """
    import torch
    from torch.distributed import ProcessGroup as BaseProcessGroup
    from torch.distributed import ProcessGroupGloo as BaseProcessGroupGloo
    from torchft.process_group import ProcessGroupGloo

    class RoutableProcessGroupGloo(ProcessGroupGloo):
        def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
            if device_host is None:
                return super()._create_pg(store, rank, world_size)
            options = BaseProcessGroupGloo._Options()
            options._timeout = self._timeout
            options._devices = [BaseProcessGroupGloo.create_device(hostname=device_host)]
            backend = BaseProcessGroupGloo(store, rank, world_size, options)
            backend._set_sequence_number_for_group()
            pg = BaseProcessGroup(store, rank, world_size)
            pg._set_default_backend(BaseProcessGroup.BackendType.GLOO)
            pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.GLOO, backend)
            return pg

    return RoutableProcessGroupGloo(timeout=timeout)


class GradientGroup:
    """One cell's membership in the gradient group of the current quorum, over ``backend``
    ("gloo" or "nccl")."""

    def __init__(self, member_id: str, timeout: timedelta, backend: str = "gloo") -> None:
        if backend not in GRADIENT_BACKENDS:
            raise ValueError(f"unknown gradient backend {backend!r}; expected one of "
                             f"{GRADIENT_BACKENDS}")
        self.member_id = member_id
        self.timeout = timeout
        self.backend = backend
        self._group: Any = None
        self.quorum_id: int | None = None
        self.rank = 0
        self.world_size = 1

    def join(self, quorum_id: int, rank: int, world_size: int, store_addr: str | None) -> None:
        """Join quorum ``quorum_id`` as ``rank`` of ``world_size``; blocks until every member
        has joined (or the timeout passes). ``world_size == 1`` means no averaging. A new
        quorum id gives a fresh store prefix, so members of an old quorum never meet members
        of the new one.

        Raises:
            ValueError: an invalid rank, or no store for a group of more than one.
            CollectiveError: the group could not be formed; no group afterwards.
        """
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"invalid rank {rank} of world {world_size}")
        self.leave()
        if world_size == 1:
            self.quorum_id, self.rank, self.world_size = quorum_id, 0, 1
            return
        if store_addr is None:
            raise ValueError("a group of more than one cell needs store_addr")
        try:
            group = self._new_group(store_addr)
            group.configure(f"{store_addr}/rl-ledger/quorum/{quorum_id}", self.member_id, rank,
                            world_size, quorum_id=quorum_id)
        except Exception as exc:
            raise CollectiveError(
                f"cell {self.member_id}: quorum {quorum_id} not formed over "
                f"{self.backend}") from exc
        self._group = group
        self.quorum_id, self.rank, self.world_size = quorum_id, rank, world_size

    def _new_group(self, store_addr: str) -> Any:
        if self.backend == "nccl":
            from torchft.process_group import ProcessGroupNCCL

            return ProcessGroupNCCL(timeout=self.timeout)
        host, port = _split_store_addr(store_addr)
        device_host = None if os.environ.get("GLOO_SOCKET_IFNAME") else (
            local_address_towards(host, port))
        return _routable_gloo(self.timeout, device_host)

    def leave(self) -> None:
        """Drop the current group, if any (a broken group is discarded quietly)."""
        if self._group is not None:
            try:
                self._group.abort(errored=False)
            except Exception:  # noqa: BLE001 - a broken group is being discarded anyway
                logger.debug("aborting the old group failed", exc_info=True)
        self._group = None

    def average(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its mean over the group (one flat all-reduce).

        Raises:
            CollectiveError: the all-reduce failed (a peer died or timed out); the group is
                dropped and must be joined again.
        """
        if self._group is None or self.world_size == 1:
            return
        import torch
        from torch.distributed import AllreduceOptions, ReduceOp

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.backend == "gloo":
            flat = flat.cpu()  # gloo's backend is registered for CPU tensors (no copy on CPU)
        options = AllreduceOptions()
        options.reduceOp = ReduceOp.SUM
        try:
            self._group.allreduce([flat], options).wait()
        except Exception as exc:
            self.leave()
            raise CollectiveError(
                f"cell {self.member_id}: gradient all-reduce failed in quorum {self.quorum_id}"
            ) from exc
        flat /= self.world_size
        offset = 0
        for parameter in parameters:
            count = parameter.numel()
            parameter.grad = flat[offset:offset + count].view_as(parameter).to(
                parameter.device, copy=True)
            offset += count
