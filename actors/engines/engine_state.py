"""The state every rollout engine keeps beside its model: version label, epoch fence, pause.

Rules (DESIGN sections 3 and 5, :mod:`actors.engines.engine_protocol`):

- ``version``: the label of the loaded weights; 0 at launch, then only what the publisher
  stamps (:meth:`EngineState.stamp`). An engine never invents a version.
- ``epoch``: the highest publisher epoch seen. Weight traffic from a lower epoch raises
  :class:`~actors.errors.StaleEpochError` and changes nothing: the ledger fences the record,
  the engines fence the tensors.
- ``paused``: set by a weight update's pause, cleared by ``continue_generation``;
  ``paused_since`` lets a parked call give up after the engine's paused-wait timeout.
- ``calls`` / ``groups``: the generate calls received and not yet answered, and their groups
  (:meth:`EngineState.receiving`), so the engine pool can tell a call the engine is working on
  (however slowly) from one that never reached it.
- ``staged``: the weights an in-flight update received (:class:`StagedUpdate`), held beside
  the serving ones until the swap at the committed version takes them, or a newer stage
  replaces them. Staging never pauses and never changes the label. While a swap loads the
  staged weights (``swapping``, between :meth:`EngineState.begin_swap` and
  :meth:`EngineState.end_swap`), a newer stage waits: it can never land between the swap's
  check and its stamp, so the loaded weights always get the label they were staged for.

Not thread-safe by itself: callers hold :attr:`EngineState.lock` (a condition, notified on
every change a waiter may care about).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from actors.errors import EngineStateError, StaleEpochError
from orchestrator.rollout.types import check_weight_version

__all__ = ["EngineState", "StagedUpdate"]


@dataclass(frozen=True)
class StagedUpdate:
    """Weights received by an in-flight update, not yet serving: what the engine loads at the
    swap (its own form; ``None`` where the engine already wrote them into a standby copy), the
    transport, the publisher's epoch and the checksum of what was received."""

    weights: Any
    transport: str
    epoch: int
    checksum: str


class EngineState:
    """Version, epoch, pause flag, in-flight count and counters of one engine."""

    def __init__(self, engine_id: str, max_calls: int) -> None:
        self.engine_id = engine_id
        self.max_calls = max_calls  # generate calls the actor runs at once (its concurrency)
        self.calls = 0
        self.groups: Counter[int] = Counter()  # group index -> its calls not yet answered
        self.lock = threading.Condition()
        self.version = 0
        self.epoch = 0
        self.paused = False
        self.updating = False
        self.in_flight = 0
        self.paused_since: float | None = None
        self.staged: StagedUpdate | None = None
        self.swapping = False
        self.counters = {"generate_calls": 0, "aborted_calls": 0, "weight_loads": 0,
                         "weight_stages": 0, "weight_swaps": 0}

    @contextmanager
    def receiving(self, group_indexes: Iterable[int]) -> Iterator[None]:
        """One ``generate`` or ``generate_batch`` call from its arrival to its answer: counted
        in :attr:`calls`, its groups in :attr:`groups`. Takes the lock itself."""
        indexes = list(group_indexes)
        with self.lock:
            self.calls += 1
            self.groups.update(indexes)
        try:
            yield
        finally:
            with self.lock:
                self.calls -= 1
                self.groups.subtract(indexes)
                self.groups = +self.groups  # drop the groups with no call left

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

    def stage(self, update: StagedUpdate) -> None:
        """Hold ``update`` for the swap, replacing anything staged before; waits (releasing
        the lock) while a swap is loading.

        Raises:
            StaleEpochError: its epoch is lower than the highest seen; nothing changes.
        """
        self.lock.wait_for(lambda: not self.swapping)
        self.check_epoch("stage_weights", update.epoch)
        self.staged = update
        self.counters["weight_stages"] += 1

    def check_swap(self, version: object, epoch: int) -> StagedUpdate:
        """The staged update a swap to ``version`` at ``epoch`` takes; checks everything the
        swap needs before the engine pauses for it. Changes nothing.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen.
            VersionLabelError: ``version`` is not an int >= 0.
            EngineStateError: nothing was staged at ``epoch`` (a swap never loads weights of
                another publisher, nor the same weights twice).
        """
        if epoch < self.epoch:
            raise StaleEpochError(self.engine_id, "swap_and_stamp", epoch, self.epoch)
        check_weight_version(version)
        if self.staged is None or self.staged.epoch != epoch:
            raise EngineStateError(
                f"engine {self.engine_id} has no weights staged at epoch {epoch} to swap in")
        return self.staged

    def begin_swap(self, version: object, epoch: int) -> StagedUpdate:
        """:meth:`check_swap`, then hold every newer stage back until :meth:`end_swap` (the
        caller loads the returned update without holding the lock).

        Raises: as :meth:`check_swap`; nothing changes.
        """
        staged = self.check_swap(version, epoch)
        self.swapping = True
        return staged

    def end_swap(self) -> None:
        """The swap begun by :meth:`begin_swap` is over (stamped or failed): let stages in."""
        self.swapping = False
        self.lock.notify_all()

    def swapped(self, version: int, epoch: int) -> None:
        """After the staged weights were loaded: stamp ``version`` and drop the staged copy
        (the caller resumes)."""
        self.stamp(version, epoch)
        self.staged = None
        self.counters["weight_loads"] += 1
        self.counters["weight_swaps"] += 1

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
        """id, pid, version, epoch, paused, updating, in flight, the calls received (and the
        most it runs at once) with their groups, and the counters."""
        return {
            "engine_id": self.engine_id,
            "pid": os.getpid(),
            "version": self.version,
            "epoch": self.epoch,
            "paused": self.paused,
            "updating": self.updating,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "max_calls": self.max_calls,
            "groups_in_flight": sorted(self.groups),
            **self.counters,
        }
