"""What the audit carries from one event to the next, in a form an audit checkpoint can store.

:class:`AuditState` is the run's :class:`~ledger.progress.Progress` plus the few facts only the
checks need (the cells ever promoted). It stays small
however long the run is (ranges, not per-event rows), so ``audit_checkpoints`` can hold it and
``verify --since-verified`` can start from it: the events after the checkpoint are then checked
exactly as a full verify would check them. A checkpoint is trusted only if its ``head_hash`` is
the chain's hash at its seq; a full verify re-derives every checkpoint's state and reports one
that disagrees (``audit_checkpoint_mismatch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.progress import STATE_FORMAT as PROGRESS_FORMAT, Progress

__all__ = ["AuditState"]

STATE_FORMAT = 1


@dataclass
class AuditState:
    """The audit's fold of a run up to ``progress.last_seq``."""

    progress: Progress = field(default_factory=Progress)
    promoted_cells: set[str] = field(default_factory=set)
    first_kind: str | None = None  # the kind of event 1 (None: not seen yet)

    @property
    def unstamped_versions(self) -> list[int]:
        """Committed versions (1..head) that no ``engines_stamped`` names."""
        return self.progress.unstamped_versions

    def to_json(self, progress_format: int = PROGRESS_FORMAT) -> dict[str, Any]:
        """The state as JSON (what an audit checkpoint stores), its progress in
        ``progress_format``."""
        return {"format": STATE_FORMAT, "progress": self.progress.to_json(progress_format),
                "promoted_cells": sorted(self.promoted_cells), "first_kind": self.first_kind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditState:
        """The state :meth:`to_json` wrote.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a state.
        """
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"checkpoint format {data.get('format')!r}, not {STATE_FORMAT}")
        return cls(progress=Progress.from_json(data["progress"]),
                   promoted_cells={str(cell) for cell in data["promoted_cells"]},
                   first_kind=data["first_kind"])
