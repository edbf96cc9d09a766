"""Recovery figures of a campaign, from its ledger alone: which faults fired, which recovered,
and how long each recovery took.

A recovery time runs from the moment the fault fired (the ``fired_at`` its ``fault_injected``
records; an outage records itself only once the database is back) to the first version the
recovery committed. For a fault that costs the publisher (a publisher killed or frozen, the
driver or everything killed, its node lost) that is the first commit at an epoch above the one
current when the fault fired: a publisher that outlived a killed driver may still finish the
commit it was in, legally, at the old epoch, and the recovery did not make that one (the drill
table's negative ``recover s`` came from counting it). For a fault that costs an engine or the
rollout manager it is the first commit after the supervisor replaced that actor
(``actor_replaced``), or after a resume that replaced everything: the step in progress when the
manager froze still commits without it, and the stall comes at the next drain. For any other
fault it is the first commit after the firing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ledger import Event, EventKind
from orchestrator.chaos.nemesis import FaultKind

__all__ = ["FAILOVER_KINDS", "REPLACED_ACTOR", "FiredFault", "fired_faults", "percentile"]

# Kinds whose recovery is a replaced actor: the ``actor`` its ``actor_replaced`` names.
REPLACED_ACTOR = {
    FaultKind.KILL_ENGINE: "engine", FaultKind.FREEZE_ENGINE: "engine",
    FaultKind.KILL_ROLLOUT_MANAGER: "rollout-manager",
    FaultKind.FREEZE_ROLLOUT_MANAGER: "rollout-manager",
}

FAILOVER_KINDS = frozenset({
    FaultKind.KILL_PUBLISHER_MID_TRAIN, FaultKind.KILL_PUBLISHER_MID_TRANSFER,
    FaultKind.KILL_PUBLISHER_AFTER_COMMIT, FaultKind.ZOMBIE_PUBLISHER, FaultKind.KILL_DRIVER,
    FaultKind.KILL_EVERYTHING, FaultKind.KILL_NODE,
})


@dataclass(frozen=True)
class FiredFault:
    """One fault as it fired, and its recovery (None: no commit followed it)."""

    index: int
    kind: FaultKind
    planned_step: int
    point: str
    fired_at: datetime
    seq: int
    recovery_s: float | None
    recovered_by: int | None  # the version whose commit ended the recovery
    during_recovery_of: int | None = None  # an earlier fault still recovering when this fired


def fired_faults(events: Iterable[Event]) -> list[FiredFault]:
    """Every planned fault the run's ``events`` record as fired, in firing order, each with its
    recovery time (see the module doc)."""
    events = list(events)
    promotions = [(e.recorded_at, e.epoch or 0) for e in events
                  if e.kind == EventKind.CELL_PROMOTED]
    commits = [(e.recorded_at, e.epoch or 0, e.version or 0) for e in events
               if e.kind == EventKind.WEIGHT_COMMITTED]
    fired = []
    for event in events:
        fault = event.payload.get("fault") if event.kind == EventKind.FAULT_INJECTED else None
        if not fault:
            continue
        kind = FaultKind(fault["kind"])
        at = _fired_at(event)
        epoch = max((epoch for when, epoch in promotions if when <= at), default=0)
        since = at
        if kind in REPLACED_ACTOR:
            since = _replaced_at(events, event, REPLACED_ACTOR[kind])
        recovery = None if since is None else next(
            ((when, version) for when, commit_epoch, version in commits
             if when >= since and (kind not in FAILOVER_KINDS or commit_epoch > epoch)), None)
        fired.append(FiredFault(
            index=int(fault["index"]), kind=kind, planned_step=int(fault["step"]),
            point=str(event.payload.get("point")), fired_at=at, seq=event.seq,
            recovery_s=None if recovery is None else (recovery[0] - at).total_seconds(),
            recovered_by=None if recovery is None else recovery[1],
        ))
    return _overlaps(sorted(fired, key=lambda f: f.fired_at))


def _overlaps(fired: list[FiredFault]) -> list[FiredFault]:
    """Mark each fault that fired while an earlier one had not recovered yet (its recovery
    commit came after this firing, or never): the faults that really landed in a recovery."""
    marked = []
    for position, fault in enumerate(fired):
        open_before = [earlier for earlier in fired[:position]
                       if earlier.recovery_s is None
                       or earlier.fired_at + timedelta(seconds=earlier.recovery_s)
                       > fault.fired_at]
        marked.append(replace(fault, during_recovery_of=open_before[-1].index)
                      if open_before else fault)
    return marked


def _replaced_at(events: list[Event], fault: Event, actor: str) -> datetime | None:
    """When the actor ``fault`` cost was replaced: its ``actor_replaced`` (the same engine id
    where the fault names one), or a resume, whichever comes first after the fault; None if
    neither does."""
    engine = (fault.payload.get("detail") or {}).get("engine")
    for event in events:
        if event.seq <= fault.seq:
            continue
        if event.kind == EventKind.RUN_RESUMED:
            return event.recorded_at
        if (event.kind == EventKind.ACTOR_REPLACED and event.payload.get("actor") == actor
                and (engine is None or event.payload.get("actor_id") == engine)):
            return event.recorded_at
    return None


def _fired_at(event: Event) -> datetime:
    fired_at = event.payload.get("fired_at")
    return datetime.fromisoformat(fired_at) if fired_at else event.recorded_at


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
