"""The chaos campaign's nemesis schedule: which fault fires at which step, drawn from a seed.

Faults arrive as a Poisson process over training steps (exponential gaps with mean
``mean_interval`` steps, as Jepsen's nemeses and miles' fault-tolerance soaks draw them), each of a
kind drawn uniformly from the kinds the campaign allows. The whole schedule is drawn up front and
recorded in the ledger (``drill_started``), so a campaign replays from its seed and the checker
can say which planned fault a violation followed.

With ``overlap`` off, a fault is never planned within ``recovery_steps`` of the previous one (each
recovery is seen on its own). With it on, a fault drawn within ``recovery_steps`` of the previous
one is planned *into that one's recovery* (:attr:`PlannedFault.after`): it fires at the first
hook point of the job after its predecessor fired, before the step that recovers from it
commits (an engine dies during a failover, the database blips during a resume, the new publisher
is killed before its first commit). Firing at a step's end alone would not do: most recoveries
end within the step after their fault, so such faults landed in a recovery almost never.
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
    """One fault of the schedule: its position, the step it fires at, and its kind.

    ``after``: the index of the fault into whose recovery this one is planned (it fires as soon
    as that one has fired, at the next hook point of the job, instead of at a step's end);
    None for a fault that fires at the end of ``step``.
    """

    index: int
    step: int
    kind: FaultKind
    after: int | None = None

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
        after = None
        if faults and step < faults[-1].step + recovery_steps:
            if overlap:  # into the previous fault's recovery
                step, after = faults[-1].step, faults[-1].index
            else:
                step = faults[-1].step + recovery_steps
        if step >= last_step:
            return faults
        faults.append(PlannedFault(len(faults), step, rng.choice(list(kinds)), after))


def schedule_from_payload(items: Iterable[dict[str, object]]) -> list[PlannedFault]:
    """The schedule back from its recorded JSON form (:meth:`PlannedFault.to_payload`)."""
    return [PlannedFault(int(item["index"]), int(item["step"]), FaultKind(str(item["kind"])),
                         None if item.get("after") is None else int(item["after"]))
            for item in items]
