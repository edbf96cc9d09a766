"""What an audit answers: problems named by run and seq, benign notes, and compact number lists."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledger.audit.state import AuditState

__all__ = ["AuditReport", "Problem", "compact_ranges"]

MAX_RANGES = 20


@dataclass(frozen=True)
class Problem:
    """One broken invariant: where (run, seq), which check, and what is wrong.

    ``seq`` is the event the problem is at; a problem with a whole run (a missing row) names
    the newest seq the ledger still has for it, or 0 when it has none.
    """

    run_id: str
    seq: int
    check: str
    message: str

    def __str__(self) -> str:
        return f"run {self.run_id} seq {self.seq}: {self.check}: {self.message}"


@dataclass
class AuditReport:
    """The result of an audit: problems (invariant violations) and notes (benign)."""

    run_ids: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unstamped: dict[str, list[int]] = field(default_factory=dict)
    events_checked: int = 0
    witnesses_checked: int = 0
    verified_from: dict[str, int] = field(default_factory=dict)  # run -> first seq checked
    # run -> (seq, head hash, audit state) at its last event: the next audit checkpoint (its
    # JSON is rendered only by a writer that stores it; a read-only verify never pays for it)
    final_states: dict[str, tuple[int, str, AuditState]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed-but-unstamped versions, over every audited run (one run: just its own)."""
        return sorted(v for versions in self.unstamped.values() for v in versions)


def compact_ranges(numbers: Iterable[int], max_ranges: int = MAX_RANGES) -> str:
    """Integers as sorted ranges, ``1-57, 59, 61-3400``; past ``max_ranges`` ranges the rest
    is counted instead of listed: ``1-3, 5, ... and 40 more ranges (3357 in all)``."""
    ordered = sorted(set(numbers))
    ranges: list[tuple[int, int]] = []
    for number in ordered:
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], number)
        else:
            ranges.append((number, number))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:max_ranges]]
    text = ", ".join(shown)
    hidden = len(ranges) - len(shown)
    if hidden > 0:
        text += f", ... and {hidden} more range{'s' if hidden != 1 else ''} ({len(ordered)} in all)"
    return text
