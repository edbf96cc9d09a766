"""The cells' gradient group: a gloo group re-formed per quorum, and its rendezvous store.

Mechanism, chosen after trying both on this CPU-only machine: **torchft's reconfigurable
``ProcessGroupGloo``** (torchft 0.2). It works on CPU, creates its gloo backend on a
``PrefixStore`` over a TCP store without touching ``torch.distributed``'s default group (which
megatron's parallel state already owns as a world of 1 per process), and a re-configure with a
fresh prefix per quorum id tears down the old group. The store is hosted by the control plane
(:func:`create_rendezvous_store`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from actors.errors import CollectiveError

__all__ = ["GradientGroup", "create_rendezvous_store"]

logger = logging.getLogger(__name__)


def create_rendezvous_store(host: str = "127.0.0.1", port: int = 0) -> tuple[Any, str]:
    """Host the TCP store that cells rendezvous on; returns ``(store, "host:port")``.

    Keep the returned store object alive for as long as groups are formed (it is the server).
    ``port=0`` picks a free port.
    """
    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=True, wait_for_workers=False)
    return store, f"{host}:{store.port}"


class GradientGroup:
    """One cell's membership in the gradient group of the current quorum."""

    def __init__(self, member_id: str, timeout: timedelta) -> None:
        self.member_id = member_id
        self.timeout = timeout
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
        from torchft.process_group import ProcessGroupGloo

        group = ProcessGroupGloo(timeout=self.timeout)
        try:
            group.configure(f"{store_addr}/rl-ledger/quorum/{quorum_id}", self.member_id, rank,
                            world_size, quorum_id=quorum_id)
        except Exception as exc:
            raise CollectiveError(
                f"cell {self.member_id}: quorum {quorum_id} not formed") from exc
        self._group = group
        self.quorum_id, self.rank, self.world_size = quorum_id, rank, world_size

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
        from torch.distributed import AllreduceOptions, ReduceOp

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
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
            parameter.grad = flat[offset:offset + count].view_as(parameter).clone()
            offset += count
