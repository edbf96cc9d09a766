"""Where one training step's wall time went, phase by phase (``time/...`` in ``metrics.jsonl``).

The driver times each phase of a step (drain wait, train, weight update, provenance, evaluate,
checkpoint, end of step) and the weight update's own steps (``PublishOutcome.step_seconds``:
started, stage, pause, load, commit, hand_over, and tail_wait: the wait for the last update's
stamp and ``engines_stamped``, which run on the publisher cell beside the train step). From them
:meth:`StepPhases.timings` derives ``time/control_plane_s``: the step less the work the
control plane exists to schedule, the train step and the wait for generation. What is left is
ledger transactions, Ray round trips, weight staging and bookkeeping, which is what issue 25's
20 ms budget is about.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["COMPUTE_PHASES", "StepPhases"]

COMPUTE_PHASES = ("drain_wait", "train")
"""Phases that are the job's compute (or the wait for the engines' compute), not overhead."""


class StepPhases:
    """Wall seconds per phase of one step, in the order they ran."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._update: dict[str, float] = {}

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time the block as ``phase`` (added to the phase's seconds if it runs twice)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + time.monotonic() - started

    def add_update(self, step_seconds: Mapping[str, float]) -> None:
        """The weight update's own steps (``PublishOutcome.step_seconds``)."""
        for name, seconds in step_seconds.items():
            self._update[name] = self._update.get(name, 0.0) + seconds

    def timings(self, step_s: float) -> dict[str, float]:
        """The record's ``time/`` keys for a step that took ``step_s`` wall seconds."""
        compute = sum(self._seconds.get(phase, 0.0) for phase in COMPUTE_PHASES)
        timings = {f"time/{phase}_s": seconds for phase, seconds in self._seconds.items()}
        timings.update({f"time/update/{name}_s": s for name, s in self._update.items()})
        timings["time/control_plane_s"] = max(step_s - compute, 0.0)
        return timings
