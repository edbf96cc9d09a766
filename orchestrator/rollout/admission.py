"""Staleness-aware admission: start a group only if it can still be trained in time.

AReaL's ``max_head_offpolicyness`` on our ledger version. A group started now, at version
``v``, waits behind every group that is already queued or generating; the trainer takes
``rollout_batch_size`` groups per step and the version advances once every
``update_weights_interval`` steps. So the producer may start one more group only while::

    trained + queued + in_flight + 1 <= (max_weight_staleness + (v - v0) + 1) * B * I

with ``B = rollout_batch_size``, ``I = update_weights_interval``, ``trained`` the groups
trained since the producer first started, ``v0`` the version then (both 0 in a fresh run; a
resumed run or a replaced manager starts counting again), ``queued`` the groups buffered or
claimed by a drain, ``in_flight`` those generating. ``v`` is the manager's version: the
ledger head, or a newer push of a committed version.

A group that the screen recycles or drops (stale, aborted, filtered, a failover) leaves
``queued`` without entering ``trained``, so it gives its slot back: neither the dynamic filter
nor a failover can starve the producer. The bound paces generation instead of discarding it;
the staleness screen stays as the safety net (groups that finish out of order can still
overtake one another).

Liveness precondition: the trainer publishes a version every ``update_weights_interval``
steps. While it does not, the bound holds generation back (a drain then waits for the publish;
with ``max_weight_staleness = 0`` that is exactly on-policy training).

``max_weight_staleness = None`` turns the bound off; ``max_concurrent_groups`` still caps
what is in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from orchestrator.metric_keys import metric_key

__all__ = ["AdmissionControl", "AdmissionLoad"]


@dataclass(frozen=True)
class AdmissionLoad:
    """What the bound counts: groups trained in total, queued (buffered or claimed) and in
    flight, from the data buffer's accounting."""

    trained: int
    queued: int
    in_flight: int


class AdmissionControl:
    """The admission bound of one producer, and its per-step counters.

    Args:
        max_weight_staleness: the staleness the bound keeps groups within; None = no bound.
        rollout_batch_size: groups per training step (``B``).
        update_weights_interval: steps per published version (``I``).

    Single event loop, not thread-safe.

    Raises:
        ValueError: an option out of range.
    """

    def __init__(self, max_weight_staleness: int | None, rollout_batch_size: int,
                 update_weights_interval: int = 1) -> None:
        if max_weight_staleness is not None and max_weight_staleness < 0:
            raise ValueError(f"max_weight_staleness must be >= 0, got {max_weight_staleness}")
        if rollout_batch_size < 1 or update_weights_interval < 1:
            raise ValueError("rollout_batch_size and update_weights_interval must be >= 1")
        self.max_weight_staleness = max_weight_staleness
        self.groups_per_version = rollout_batch_size * update_weights_interval
        self._origin: tuple[int, int] | None = None  # (version v0, trained at v0)
        self._held_since: float | None = None
        self._admitted = 0
        self._held_back = 0
        self._held_s = 0.0
        self.admitted_total = 0
        self.held_back_total = 0

    @property
    def enabled(self) -> bool:
        """False when ``max_weight_staleness`` is None (only the concurrency cap applies)."""
        return self.max_weight_staleness is not None

    @property
    def origin(self) -> tuple[int, int] | None:
        """``(v0, trained at v0)``, set by the first :meth:`start`; None before."""
        return self._origin

    def start(self, version: int, trained: int) -> None:
        """Fix the origin the first time the producer starts; later calls change nothing
        (a paused and restarted producer, as in ``--sync``, keeps counting)."""
        if self._origin is None:
            self._origin = (version, trained)

    def limit(self, version: int) -> int | None:
        """Groups (trained since the origin + queued + in flight) the bound allows at
        ``version``; None without a bound.

        Raises:
            RuntimeError: :meth:`start` was never called.
        """
        if self.max_weight_staleness is None:
            return None
        if self._origin is None:
            raise RuntimeError("AdmissionControl.start() was never called")
        origin_version, _ = self._origin
        # A version below the origin cannot happen (the manager's version never decreases);
        # clamp anyway so a bug there cannot make the limit negative.
        advanced = max(0, version - origin_version)
        return (self.max_weight_staleness + advanced + 1) * self.groups_per_version

    def occupancy(self, load: AdmissionLoad) -> int:
        """What ``load`` counts against the limit: trained since the origin + queued +
        in flight."""
        trained_at_origin = self._origin[1] if self._origin else 0
        return (load.trained - trained_at_origin) + load.queued + load.in_flight

    def admits(self, version: int, load: AdmissionLoad) -> bool:
        """True if one more group may start at ``version``; counts the decision.

        A refusal starts (or continues) a hold; the next admission ends it and counts one
        group held back, with the time it waited.
        """
        limit = self.limit(version)
        allowed = limit is None or self.occupancy(load) + 1 <= limit
        now = time.monotonic()
        if not allowed:
            if self._held_since is None:
                self._held_since = now
            return False
        if self._held_since is not None:
            self._held_back += 1
            self.held_back_total += 1
            self._held_s += now - self._held_since
            self._held_since = None
        self._admitted += 1
        self.admitted_total += 1
        return True

    @property
    def holding(self) -> bool:
        """True while the bound is holding the next group back."""
        return self._held_since is not None

    def version_awaited(self, load: AdmissionLoad) -> int | None:
        """The first version at which one more group is admitted under ``load``: the version
        a drain held back by the bound waits for. None without a bound or before :meth:`start`.
        """
        if self.max_weight_staleness is None or self._origin is None:
            return None
        origin_version, _ = self._origin
        versions_needed = -(-(self.occupancy(load) + 1) // self.groups_per_version)  # ceil
        return origin_version + max(0, versions_needed - self.max_weight_staleness - 1)

    def hold_detail(self, version: int, load: AdmissionLoad) -> str | None:
        """Why nothing starts, while the bound holds the next group back (for a stall
        warning): the limit at ``version``, the occupancy and the version awaited. None
        while it does not hold."""
        if not self.holding:
            return None
        return (f"held back by the admission bound: occupancy {self.occupancy(load)} of limit "
                f"{self.limit(version)} at v{version}, waiting for "
                f"v{self.version_awaited(load)}")

    def pop_metrics(self, version: int, load: AdmissionLoad) -> dict[str, float | int | None]:
        """This step's counters (``rollout/fully_async/admission_*``); resets them.

        ``admitted``: groups started; ``held_back``: starts the bound delayed;
        ``held_s``: seconds the producer waited on the bound (a hold still open counts up
        to now); ``limit`` and ``occupancy``: the bound now (limit None without a bound).
        """
        held_s = self._held_s
        now = time.monotonic()
        if self._held_since is not None:
            held_s += now - self._held_since
            self._held_since = now
        metrics = {
            metric_key("admission_admitted"): self._admitted,
            metric_key("admission_held_back"): self._held_back,
            metric_key("admission_held_s"): held_s,
            metric_key("admission_limit"): self.limit(version) if self._origin else None,
            metric_key("admission_occupancy"): self.occupancy(load),
        }
        self._admitted = self._held_back = 0
        self._held_s = 0.0
        return metrics
