"""Provenance: one ``batch_trained`` event per training step, and prompt accounting from it.

The driver records each step after its publish (so the version it produced is known): the
train step, the version the trainer held, the version it produced, the cells in the step, the
number of groups and samples, the histogram of sample versions (the oldest version of each
sample), the widest token-version span (partial rollout), staleness min/avg/max, a digest of
the prompt ids trained, and the prompts the step settled (trained, dropped by reason) with the
prompt stream's position. The payload is bounded by the batch size: no per-sample rows.

The event is driver-recorded, not publisher-fenced: it states what the trainer consumed, which
is true whoever publishes next. A crash between a step's commit and its ``batch_trained``
leaves that step unrecorded; its prompts count as in flight and a resume trains them again
(the weights that trained them are rolled back to the checkpoint anyway).

From these events alone the ledger answers where every prompt is (:func:`prompt_ledger`, the
fold in :mod:`ledger.provenance`, re-exported here), and a resume or a replaced rollout manager
continues the prompt stream from there (``RolloutManager.restore_from_ledger``): no prompt
trained twice, none skipped.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from ledger import Event, EventKind, Ledger
from ledger.provenance import PromptLedger, prompt_digest, prompt_ledger
from orchestrator.rollout.types import RolloutFnTrainOutput, Sample

__all__ = [
    "PromptLedger",
    "ProvenanceRecorder",
    "prompt_digest",
    "prompt_ledger",
]


class ProvenanceRecorder:
    """Builds and appends each step's ``batch_trained`` event."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self._reported_dropped: set[int] = set()

    def forget_dropped(self, already: Iterable[int]) -> None:
        """Prompts whose drop is on record already (after a resume or a manager replacement)."""
        self._reported_dropped.update(already)

    def record(self, train_step: int, batch: RolloutFnTrainOutput, *, trainer_version: int,
               produced_version: int | None, cells: Sequence[str],
               drain_version: int, dropped_prompts: dict[int, str], next_index: int,
               recycled: int) -> Event:
        """Append the ``batch_trained`` event of ``train_step`` (1-based); returns it.

        ``drain_version`` is the version the batch was drained at (staleness is measured from
        it); ``dropped_prompts`` is the rollout manager's map prompt -> drop reason; drops not
        reported yet are reported now. Idempotent per step (a retried append returns the stored
        one).
        """
        samples = [sample for group in batch.samples for sample in group]
        trained = sorted({sample.group_index for sample in samples})
        dropped: dict[str, list[int]] = {}
        for index, reason in sorted(dropped_prompts.items()):
            if index not in self._reported_dropped:
                dropped.setdefault(reason, []).append(index)
                self._reported_dropped.add(index)
        payload = {
            "train_step": train_step,
            "trainer_version": trainer_version,
            "produced_version": produced_version,
            "cells": list(cells),
            "groups": len(batch.samples),
            "samples": len(samples),
            **_version_summary(samples, drain_version),
            "prompt_digest": prompt_digest(trained),
            "prompts": {"trained": trained, "dropped": dropped, "recycled": recycled,
                        "next_index": next_index},
        }
        return self.ledger.append(self.run_id, EventKind.BATCH_TRAINED, payload,
                                  idempotency_key=f"{self.run_id}:batch_trained:{train_step}")


def _version_summary(samples: Sequence[Sample], current: int) -> dict:
    oldest = [sample.oldest_weight_version for sample in samples]
    versions = [version for version in oldest if version is not None]
    # Not clamped: a negative value is recorded as it is and the audit reports it.
    staleness = [current - version for version in versions] or [0]
    spans = [sample.version_span for sample in samples] or [0]
    return {
        "sample_versions": {str(v): n for v, n in sorted(Counter(versions).items())},
        "token_version_span_max": max(spans),
        "mixed_version_samples": sum(1 for span in spans if span > 0),
        "staleness": {"min": min(staleness), "avg": round(statistics.fmean(staleness), 4),
                      "max": max(staleness)},
    }
