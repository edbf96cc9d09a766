"""The chaos campaign's nemesis schedule: which fault fires at which step, drawn from a seed.

Faults arrive as a Poisson process over training steps (exponential gaps with mean
``mean_interval`` steps, as Jepsen's nemeses and miles' fault-tolerance soaks draw them), each of a
kind drawn uniformly from the kinds the campaign allows. The whole schedule is drawn up front and
recorded in the ledger (``drill_started``), so a campaign replays from its seed and the checker
can say which planned fault a violation followed.

With ``overlap`` off, a fault is never planned within ``recovery_steps`` of the previous one (each
recovery is seen on its own); with it on, gaps are kept as drawn, so a fault may land inside the
recovery from the one before (an engine dies during a failover, the database blips during a
resume).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

__all__ = ["FaultKind", "PlannedFault", "draw_schedule", "schedule_from_payload"]


class FaultKind(str, enum.Enum):
    """Every fault a campaign can inject; the values are the drill scenario names they reuse
    (``freeze-engine``, ``freeze-follower`` and ``freeze-rollout-manager`` are the campaign's
    own: SIGSTOP, then SIGCONT once the supervisor replaced the frozen actor)."""

    KILL_PUBLISHER_MID_TRAIN = "kill-publisher-mid-train"
    KILL_PUBLISHER_MID_TRANSFER = "kill-publisher-mid-transfer"
    KILL_PUBLISHER_AFTER_COMMIT = "kill-publisher-after-commit"
    ZOMBIE_PUBLISHER = "zombie-publisher"
    KILL_FOLLOWER = "kill-follower"
    KILL_ENGINE = "kill-engine"
    FREEZE_ENGINE = "freeze-engine"
    KILL_ROLLOUT_MANAGER = "kill-rollout-manager"
    DATABASE_OUTAGE = "database-outage"
    KILL_DRIVER = "kill-driver"
    KILL_EVERYTHING = "kill-everything"
    KILL_NODE = "kill-node"
    FREEZE_FOLLOWER = "freeze-follower"
    FREEZE_ROLLOUT_MANAGER = "freeze-rollout-manager"

    @classmethod
    def parse(cls, names: Iterable[str]) -> list[FaultKind]:
        """The kinds named in ``names``.

        Raises:
            ValueError: a name that is not a fault kind (the message lists the known ones).
        """
        kinds = []
        for name in names:
            try:
                kinds.append(cls(name))
            except ValueError:
                known = ", ".join(kind.value for kind in cls)
                raise ValueError(f"unknown fault kind {name!r} (known: {known})") from None
        return kinds


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the schedule: its position, the step it fires at, and its kind."""

    index: int
    step: int
    kind: FaultKind

    def to_payload(self) -> dict[str, object]:
        """The JSON form recorded in ``drill_started`` and ``fault_injected``."""
        return {**asdict(self), "kind": self.kind.value}


def draw_schedule(seed: int, steps: int, *, mean_interval: float = 10.0,
                  kinds: Sequence[FaultKind] = tuple(FaultKind), overlap: bool = False,
                  recovery_steps: int = 3, first_step: int = 2) -> list[PlannedFault]:
    """The faults a campaign of ``steps`` training steps injects, drawn from ``seed``.

    Faults fire at steps in ``[first_step, steps - recovery_steps)``, so the run has steps left to
    show it recovered from the last one. The same arguments always give the same schedule.

    Raises:
        ValueError: no kinds, a non-positive ``mean_interval``, or too few steps for any fault.
    """
    if not kinds:
        raise ValueError("every fault kind is excluded: nothing to inject")
    if mean_interval <= 0:
        raise ValueError(f"--mean-interval must be positive, got {mean_interval}")
    last_step = steps - recovery_steps
    if last_step <= first_step:
        raise ValueError(f"--steps {steps} leaves no step for a fault (need more than "
                         f"{first_step + recovery_steps})")
    rng = random.Random(seed)
    faults: list[PlannedFault] = []
    position = float(first_step)
    while True:
        position += rng.expovariate(1.0 / mean_interval)
        step = int(position)
        if faults and not overlap:
            step = max(step, faults[-1].step + recovery_steps)
        elif faults:
            step = max(step, faults[-1].step)  # several faults may share a step
        if step >= last_step:
            return faults
        faults.append(PlannedFault(len(faults), step, rng.choice(list(kinds))))


def schedule_from_payload(items: Iterable[dict[str, object]]) -> list[PlannedFault]:
    """The schedule back from its recorded JSON form (:meth:`PlannedFault.to_payload`)."""
    return [PlannedFault(int(item["index"]), int(item["step"]), FaultKind(str(item["kind"])))
            for item in items]
