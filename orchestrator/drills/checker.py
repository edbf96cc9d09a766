"""The drill checker: DESIGN section 4, judged from a run's recorded history.

Like Jepsen's checkers, it reads only what was recorded: the run's ledger events (and their
audit) and the run's own final metrics (the ``run_finished`` payload written by the driver from
the rollout manager's counters). It never asks a live process, so a drill's verdict can be
recomputed later from the database alone (``ledger verify`` sees the same events).

What it checks, on top of :meth:`ledger.Ledger.verify`:

* committed versions are exactly 1..k, in seq order, each once (invariant 2);
* epochs of ``cell_promoted`` are 1, 2, 3, ... and every ``weight_committed`` carries the epoch
  and cell of the newest promotion before it (invariants 3, 4);
* the run finished, with zero negative staleness and zero prompts unaccounted (6, 7);
* the fault really fired, and a version was committed after it (the run recovered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger import Ledger

__all__ = ["CheckReport", "check_run", "first_commit_after"]


@dataclass
class CheckReport:
    """What the checker found: ``problems`` (each one fails the drill) and the numbers the
    verdict table shows."""

    problems: list[str] = field(default_factory=list)
    head_version: int = 0
    committed_versions: list[int] = field(default_factory=list)
    unstamped_versions: list[int] = field(default_factory=list)
    promotions: int = 0
    negative_staleness: int | None = None
    prompts_unaccounted: int | None = None
    finished: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def first_commit_after(ledger: Ledger, run_id: str, seq: int) -> Any | None:
    """The first ``weight_committed`` event with a seq above ``seq``, or None."""
    for event in ledger.events(run_id, start_seq=seq + 1):
        if event.kind == "weight_committed":
            return event
    return None


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds (both timezone-aware)."""
    return (end - start).total_seconds()


def check_run(ledger: Ledger, run_id: str, *, expect_finished: bool = True) -> CheckReport:
    """Check every invariant of DESIGN section 4 that the recorded history of ``run_id`` shows.

    Precondition: the run exists in ``ledger``. Reads only; safe while the run is live (the
    report then describes a prefix of the history).

    Raises:
        LedgerError: the ledger cannot be read (after its read retries).
    """
    report = CheckReport()
    audit = ledger.verify(run_id)
    report.problems.extend(f"audit: {p.check} at seq {p.seq}: {p.message}" for p in audit.problems)
    report.unstamped_versions = list(audit.unstamped.get(run_id, []))

    epoch, publisher = 0, None
    finished_payload: dict[str, Any] | None = None
    for event in ledger.events(run_id):
        if event.kind == "cell_promoted":
            report.promotions += 1
            new_epoch = int(event.epoch if event.epoch is not None else event.payload["epoch"])
            if new_epoch != epoch + 1:
                report.problems.append(
                    f"seq {event.seq}: promotion to epoch {new_epoch} after epoch {epoch}"
                )
            epoch, publisher = new_epoch, event.cell_id
        elif event.kind == "weight_committed":
            report.committed_versions.append(int(event.version))
            if (event.cell_id, event.epoch) != (publisher, epoch):
                report.problems.append(
                    f"seq {event.seq}: v{event.version} committed by {event.cell_id} at epoch "
                    f"{event.epoch}, but the publisher is {publisher} at epoch {epoch}"
                )
        elif event.kind == "run_finished":
            finished_payload = event.payload
    expected = list(range(1, len(report.committed_versions) + 1))
    if report.committed_versions != expected:
        report.problems.append(
            f"committed versions are {_span(report.committed_versions)}, not 1..{len(expected)} "
            "gapless in seq order"
        )
    report.head_version = ledger.head(run_id).version
    if report.committed_versions and report.head_version != report.committed_versions[-1]:
        report.problems.append(
            f"head v{report.head_version} is not the newest commit v{report.committed_versions[-1]}"
        )

    if finished_payload is not None:
        report.finished = True
        report.negative_staleness = int(finished_payload.get("negative_staleness_total", 0))
        report.prompts_unaccounted = int(finished_payload.get("prompts_unaccounted", 0))
        if report.negative_staleness:
            report.problems.append(f"negative staleness counted {report.negative_staleness} times")
        if report.prompts_unaccounted:
            report.problems.append(f"{report.prompts_unaccounted} prompts unaccounted for")
    elif expect_finished:
        report.problems.append("the run did not finish (no run_finished event)")
    return report


def _span(versions: list[int]) -> str:
    if len(versions) <= 8:
        return str(versions)
    return f"[{versions[0]}, {versions[1]}, ..., {versions[-1]}] ({len(versions)} commits)"
