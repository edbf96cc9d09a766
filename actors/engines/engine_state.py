"""The state every rollout engine keeps beside its model: version label, epoch fence, pause.

Rules (DESIGN sections 3 and 5, :mod:`actors.engines.engine_protocol`):

- ``version``: the label of the loaded weights; 0 at launch, then only what the publisher
  stamps (:meth:`EngineState.stamp`). An engine never invents a version.
- ``epoch``: the highest publisher epoch seen. Weight traffic from a lower epoch raises
  :class:`~actors.errors.StaleEpochError` and changes nothing: the ledger fences the record,
  the engines fence the tensors.
- ``paused``: set by a weight update's pause, cleared by ``continue_generation``;
  ``paused_since`` lets a parked call give up after the engine's paused-wait timeout.

Not thread-safe by itself: callers hold :attr:`EngineState.lock` (a condition, notified on
every change a waiter may care about).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from actors.errors import EngineStateError, StaleEpochError
from orchestrator.rollout.types import check_weight_version

__all__ = ["EngineState"]


class EngineState:
    """Version, epoch, pause flag, in-flight count and counters of one engine."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.lock = threading.Condition()
        self.version = 0
        self.epoch = 0
        self.paused = False
        self.updating = False
        self.in_flight = 0
        self.paused_since: float | None = None
        self.counters = {"generate_calls": 0, "aborted_calls": 0, "weight_loads": 0}

    def check_epoch(self, operation: str, epoch: int) -> None:
        """Adopt ``epoch`` if it is not below the highest seen.

        Raises:
            StaleEpochError: ``epoch`` is lower; nothing changes.
        """
        if epoch < self.epoch:
            raise StaleEpochError(self.engine_id, operation, epoch, self.epoch)
        self.epoch = epoch

    def stamp(self, version: object, epoch: int) -> None:
        """Label the loaded weights ``version`` (after the ledger committed it).

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
        """
        if epoch < self.epoch:
            raise StaleEpochError(self.engine_id, "update_weight_version", epoch, self.epoch)
        checked = check_weight_version(version)
        self.epoch = epoch
        self.version = checked

    def pause(self) -> None:
        """Mark the engine paused (the caller stops generation)."""
        self.paused = True
        if self.paused_since is None:
            self.paused_since = time.monotonic()

    def resume(self) -> None:
        """Clear the pause and wake every waiter."""
        self.paused = False
        self.updating = False
        self.paused_since = None
        self.lock.notify_all()

    def require_paused(self, what: str) -> None:
        """Raises :class:`EngineStateError` unless paused."""
        if not self.paused:
            raise EngineStateError(f"engine {self.engine_id} must be paused to {what}")

    def wait_unpaused(self, deadline: float) -> bool:
        """Wait (holding the lock) until not paused or ``deadline``; True if not paused."""
        while self.paused and time.monotonic() < deadline:
            self.lock.wait(timeout=max(0.0, deadline - time.monotonic()))
        return not self.paused

    def parked_too_long(self, timeout_s: float) -> bool:
        """Paused for longer than ``timeout_s`` (a publisher died mid-update)."""
        return (self.paused and self.paused_since is not None
                and time.monotonic() - self.paused_since > timeout_s)

    def snapshot(self) -> dict[str, Any]:
        """id, pid, version, epoch, paused, updating, in flight and the counters."""
        return {
            "engine_id": self.engine_id,
            "pid": os.getpid(),
            "version": self.version,
            "epoch": self.epoch,
            "paused": self.paused,
            "updating": self.updating,
            "in_flight": self.in_flight,
            **self.counters,
        }
