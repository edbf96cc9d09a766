"""Which drills to run: a scenario's default plan, or seeded random plans (chaos mode)."""

from __future__ import annotations

import random

from orchestrator.drills.context import DrillError, FaultPlan
from orchestrator.drills.node_loss import NODE_SCENARIOS
from orchestrator.drills.scenarios import SCENARIOS

__all__ = ["plan_drills"]


def plan_drills(names: list[str], seed: int | None = None, repeat: int = 1) -> list[FaultPlan]:
    """The drills to run: ``names`` (or ``["all"]``) x ``repeat``. ``all`` is every scenario
    that runs on any cluster; ``kill-node`` (it needs a local multi-node cluster) is run by name.

    Without a seed and with ``repeat == 1``, each scenario at its default step (its second
    allowed one, so a checkpoint and some history exist) and its first point. With a
    seed or repeats (chaos mode), steps, points, kill delays and outage lengths are drawn from
    ``random.Random(seed)``: the same seed gives the same plans.

    Raises:
        DrillError: an unknown scenario name, or ``repeat < 1``.
    """
    if names == ["all"] or "all" in names:
        names = list(SCENARIOS)
    known = {**SCENARIOS, **NODE_SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DrillError(f"unknown scenario {unknown[0]!r}; choose from "
                         f"{', '.join(known)} or all")
    if repeat < 1:
        raise DrillError(f"--repeat must be at least 1, got {repeat}")
    if seed is None and repeat == 1:
        return [FaultPlan(n, known[n].steps[min(1, len(known[n].steps) - 1)],
                          known[n].points[0]) for n in names]
    rng = random.Random(seed if seed is not None else 0)
    return [
        FaultPlan(n, rng.choice(known[n].steps), rng.choice(known[n].points),
                  delay_s=round(rng.uniform(0.0, 0.005), 4),
                  hold_s=round(rng.uniform(3.0, 8.0), 1))
        for _ in range(repeat) for n in names
    ]
