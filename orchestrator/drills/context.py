"""What the drill runner, the scenarios and the fault primitives share, and nothing else.

:class:`DrillContext` is the small public protocol through which a scenario or a fault acts
on the drill that runs it (record that the fault fired, arm a fault on the job's hooks, run a
background thread the runner joins). The runner implements it; scenarios and faults are typed
on it and never import the runner, so the drills modules form no import circle::

    context  <-  faults, outages  <-  scenarios  <-  runner  ->  checker

The plain data a drill declares (:class:`FaultPlan`) and what its faults really did
(:class:`FaultRecord`) live here too, with the drills' own errors.
"""

from __future__ import annotations

import enum
import random
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ledger import Head, Ledger
from orchestrator.errors import DrillError, OrchestratorError

if TYPE_CHECKING:
    from orchestrator.control.placement.local import LocalCluster
    from orchestrator.control.driver import TrainingJob
    from orchestrator.control.hooks import JobHooks

__all__ = [
    "DrillPoint",
    "DrillContext",
    "DrillError",
    "FaultPlan",
    "FaultRecord",
    "StopRun",
    "error_name",
    "utcnow_naive",
]



class StopRun(OrchestratorError):
    """Raised from a drill's hook to stop a job on purpose (the first half of a resume drill).

    The runner catches it and resumes the run in a new job.
    """


class DrillPoint(enum.StrEnum):
    """Where in a job a drill's fault lands (the values are what ``--point`` and the ledger's
    ``fault_injected`` spell)."""

    MID_TRAIN = "mid-train"
    MID_TRANSFER = "mid-transfer"
    BEFORE_COMMIT = "before-commit"
    BEFORE_STAMP = "before-stamp"
    FROZEN = "frozen"
    BETWEEN_STEPS = "between-steps"
    BETWEEN_COMMIT_AND_STAMP = "between-commit-and-stamp"
    MID_DRAIN = "mid-drain"
    AFTER_PROMOTION = "after-promotion"
    STOP = "stop"


@dataclass(frozen=True)
class FaultPlan:
    """The declared schedule of one drill.

    ``step`` is the 0-based step after which the fault is injected (``mid-train`` lands inside
    the next step's training). ``delay_s`` is how long after the publisher is seen computing in
    that step the kill lands; ``hold_s`` is how long a database outage lasts.
    """

    scenario: str
    step: int
    point: DrillPoint
    delay_s: float = 0.0
    hold_s: float = 5.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "point", DrillPoint(self.point))  # a spelled point is parsed


def utcnow_naive() -> datetime:
    """Now in UTC without a timezone, like the ledger's ``recorded_at``."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class FaultRecord:
    """What a drill's fault really did (``fired`` stays False if it never acted)."""

    fired: bool = False
    fired_at: datetime | None = None  # naive UTC, like the ledger's recorded_at
    seq_at_fault: int = 0
    version_before: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def mark_fired(self, head: Head, **detail: Any) -> None:
        """Note that the fault fired now, with the ledger ``head`` read just before it."""
        self.fired = True
        self.fired_at = utcnow_naive()
        self.seq_at_fault, self.version_before = head.seq, head.version
        self.detail.update(detail)

    def fault_injected(self, plan: FaultPlan) -> dict[str, Any]:
        """The ``fault_injected`` payload of this record for ``plan`` (the detail values that
        are JSON; a drill may note an object for itself)."""
        return {
            "scenario": plan.scenario, "point": plan.point, "step": plan.step,
            "fired_at": self.fired_at.isoformat() if self.fired_at else None,
            "version_before": self.version_before,
            "detail": {key: value for key, value in self.detail.items()
                       if isinstance(value, str | int | float | bool | list | dict | None)},
        }


class DrillContext(Protocol):
    """One running drill, as its scenario and fault primitives see it.

    Every method is called from the job's driver thread (a hook) or from a fault's own
    thread; ``fired`` and ``record_fault_event`` append to the ledger and may raise
    :class:`ledger.LedgerError` after the ledger's own retries.
    """

    plan: FaultPlan
    record: FaultRecord
    rng: random.Random
    run_id: str
    ledger_url: str
    ledger: Ledger
    cluster: LocalCluster | None  # the local multi-node cluster (--local-nodes), else None

    def fired(self, job: TrainingJob, **detail: Any) -> None:
        """Record that the fault fired now (ledger head and time) and append
        ``fault_injected`` with ``detail``. Call it once per drill."""

    def record_fault_event(self) -> None:
        """Append ``fault_injected`` from :attr:`record` as it stands (a fault that sets the
        record itself, such as a database outage, calls this once the database is back)."""

    def background(self, thread: threading.Thread) -> None:
        """Start ``thread``; the runner joins it before the drill is judged."""

    def arm(self, hooks: JobHooks) -> None:
        """From now on, call ``hooks`` at every hook point of the job (after the drill's own
        handling). A fault disarms itself by doing nothing once it has fired."""


def error_name(exc: BaseException) -> str:
    """The name of the error a refused call raised, looking through Ray's task-error wrapper
    (``RayTaskError(FencedError)`` is ``"FencedError"``)."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if cause is not None else type(exc).__name__
