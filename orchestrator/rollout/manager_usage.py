"""What the rollout manager itself costs, per drain: its process's CPU time and its engine calls.

The manager shares the trainer's machine (on a small one, its cores), so its CPU is part of
every step's price. :meth:`ManagerUsage.since_last` reports, for the interval since the
previous drain ended (a step, in steady state): the manager process's CPU seconds (every
thread, Ray's included), that as a share of one core, and the engine calls and groups its pool
sent and the calls it gave up as lost (a pool that counts them: ``calls_sent``,
``groups_sent``, ``calls_lost``).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.metric_keys import metric_key

__all__ = ["ManagerUsage"]


class ManagerUsage:
    """CPU and engine traffic of this process between calls of :meth:`since_last`."""

    def __init__(self, engine_pool: Any) -> None:
        self._pool = engine_pool
        self._mark = self._now()

    def _now(self) -> tuple[float, float, int, int, int]:
        return (time.process_time(), time.monotonic(),
                int(getattr(self._pool, "calls_sent", 0)),
                int(getattr(self._pool, "groups_sent", 0)),
                int(getattr(self._pool, "calls_lost", 0)))

    def since_last(self) -> dict[str, float]:
        """The interval's ``manager_cpu_s``, ``manager_cpu_share`` (of one core),
        ``engine_calls``, ``groups_per_engine_call`` (0 when no call was sent) and
        ``engine_calls_lost``."""
        now = self._now()
        cpu, wall, calls, groups, lost = (after - before for after, before in zip(now, self._mark,
                                                                             strict=True))
        self._mark = now
        return {
            metric_key("manager_cpu_s"): cpu,
            metric_key("manager_cpu_share"): cpu / wall if wall > 0 else 0.0,
            metric_key("engine_calls"): calls,
            metric_key("groups_per_engine_call"): groups / calls if calls else 0.0,
            metric_key("engine_calls_lost"): lost,
        }
