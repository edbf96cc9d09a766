"""The rows the append derives from payloads, re-derived: each event's ``train_step`` column
and the ``version_uses`` rows of each ``batch_trained`` (revision 0003).

Both sit outside the hash chain (they are copies, kept for indexed reads: ``ledger lineage``
and ``show``), so nothing but this check would notice one edited, deleted or planted:

- ``train_step_column``: the column differs from the payload's ``train_step``. A NULL column
  is accepted for kinds outside the step kinds (revision 0003 filled it in for those only);
- ``version_uses_mismatch``: the rows of a ``batch_trained`` differ from its
  ``sample_versions`` (a row missing, extra, or with other samples or step), or rows name a
  seq that is no ``batch_trained`` of the run.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.events import Event, EventKind
from ledger.provenance import BatchView

__all__ = ["DerivedRowChecker"]

# The kinds whose column revision 0003 back-filled (and the append always fills).
_STEP_KINDS = frozenset({
    EventKind.BATCH_TRAINED, EventKind.WEIGHT_UPDATE_STARTED, EventKind.WEIGHT_UPDATE_ABORTED,
    EventKind.WEIGHT_COMMITTED, EventKind.CHECKPOINT_SAVED,
})

Report = Callable[[int, str, str], None]


class DerivedRowChecker:
    """Checks one run's derived rows as its events stream past; ``uses`` is the run's
    ``version_uses`` rows from the audit's first seq on (seq -> {version: (step, samples)})."""

    def __init__(self, report: Report, uses: dict[int, dict[int, tuple]]) -> None:
        self.report = report
        self.uses = uses

    def check(self, event: Event, batch: BatchView | None) -> None:
        """Check the event's derived rows; ``batch``: its parsed ``batch_trained`` (None:
        another kind, or a malformed one, which ``batch_malformed`` names)."""
        step = event.payload.get("train_step")  # tolerant: a malformed payload is named apart
        expected = step if isinstance(step, int) else None
        if event.train_step != expected and (event.train_step is not None
                                             or event.kind in _STEP_KINDS):
            self.report(event.seq, "train_step_column",
                        f"{event.kind} row's train_step column is {event.train_step}; its "
                        f"payload says {expected}")
        stored = self.uses.pop(event.seq, {})
        if event.kind == EventKind.BATCH_TRAINED and batch is None:
            return
        derived = {} if batch is None else {
            version: (batch.train_step, samples)
            for version, samples in batch.sample_versions.items()}
        if stored != derived:
            self.report(event.seq, "version_uses_mismatch",
                        f"version_uses rows of seq {event.seq} say {_render(stored)}; "
                        f"{'its sample_versions say ' + _render(derived) if batch else 'it is no batch_trained'}")

    def finish(self) -> None:
        """After the last event: rows that name a seq past it."""
        for seq in sorted(self.uses):
            self.report(seq, "version_uses_mismatch",
                        f"version_uses rows name seq {seq}, past the run's last event")
        self.uses.clear()


def _render(uses: dict[int, tuple]) -> str:
    if not uses:
        return "none"
    return ", ".join(f"v{version}: step {step} x{samples}"
                     for version, (step, samples) in sorted(uses.items()))
