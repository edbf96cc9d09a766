"""The audit's provenance checks: each ``batch_trained`` against the ledger at its seq, and the
prompt account of a finished run.

Called by :class:`ledger.audit.event_checks.EventChecker` before it folds the event, so "the ledger at
its seq" is the read model as of the previous event. Every check names its problem by run and
seq:

- ``batch_malformed``: a ``batch_trained`` payload that does not fit its model (not folded);
- ``step_twice``: a train step recorded by a second ``batch_trained``;
- ``version_above_head``: a step that trained on samples of a version above the head (or held
  one), which no engine could have served yet;
- ``produced_uncommitted``: a ``produced_version`` that is not a committed version;
- ``negative_staleness``: a step whose staleness min is below 0 (DESIGN invariant 6);
- ``prompt_trained_twice``, ``prompt_trained_and_dropped``: a prompt settled twice;
- ``prompt_past_stream``: a trained or dropped prompt id at or past the stream position the
  same event records (or below 0): a prompt that was never issued;
- ``prompt_carry_over``: a ``run_resumed`` whose ``prompts_carried_over`` or
  ``next_prompt_index`` differs from the ledger's account at its seq (prompts lost or skipped);
- ``prompt_balance`` (at each ``run_finished``): issued == trained + dropped + in flight, with
  in flight the issued prompts neither trained nor dropped (carried-over prompts among them),
  ``prompts_unaccounted`` (the rollout manager's own count) zero, and, when the event carries
  the producer's ``prompts_issued`` and ``prompts_in_flight``, the same equation with those.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.events import Event, EventKind
from ledger.projections import RunState
from ledger.provenance import BatchView, parse_batch
from ledger.audit.report import compact_ranges

__all__ = ["ProvenanceChecker"]

Report = Callable[[int, str, str], None]


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ProvenanceChecker:
    """Checks ``batch_trained``, ``run_resumed`` and ``run_finished`` events against the state
    folded so far; ``report(seq, check, message)`` records each problem."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.step_seqs: dict[int, int] = {}

    def check(self, event: Event, state: RunState) -> None:
        """Check one event (before it is folded into ``state``)."""
        if event.kind == EventKind.BATCH_TRAINED:
            batch = parse_batch(event)
            if batch is None:
                self.report(event.seq, "batch_malformed",
                            "batch_trained payload does not fit its model (not folded)")
                return
            self._check_batch(batch, state)
        elif event.kind == EventKind.RUN_RESUMED:
            self._check_resume(event, state)
        elif event.kind == EventKind.RUN_FINISHED:
            self._check_balance(event, state)

    def _check_batch(self, batch: BatchView, state: RunState) -> None:
        seq, step = batch.seq, batch.train_step
        if step in self.step_seqs:
            self.report(seq, "step_twice",
                        f"train step {step} already recorded at seq {self.step_seqs[step]}")
        else:
            self.step_seqs[step] = seq
        newest = batch.newest_sample_version
        if newest is not None and newest > state.head_version:
            self.report(seq, "version_above_head",
                        f"step {step} trained on samples of version {newest}; head was "
                        f"version {state.head_version}")
        if batch.trainer_version > state.head_version:
            self.report(seq, "version_above_head",
                        f"step {step} held version {batch.trainer_version}; head was version "
                        f"{state.head_version}")
        produced = batch.produced_version
        if produced is not None and produced not in state.commits:
            self.report(seq, "produced_uncommitted",
                        f"step {step} produced version {produced}, which is not committed")
        if batch.staleness_min < 0:
            self.report(seq, "negative_staleness",
                        f"step {step} staleness min {batch.staleness_min} (a sample newer than "
                        "the version it was measured against)")
        self._check_prompts(batch, state)

    def _check_prompts(self, batch: BatchView, state: RunState) -> None:
        seq, step, prompts = batch.seq, batch.train_step, state.prompts
        trained = set(batch.prompts_trained)
        dropped = {index for ids in batch.prompts_dropped.values() for index in ids}
        again = sorted(index for index in trained if index in prompts.trained)
        if again:
            steps = sorted({prompts.trained[index] for index in again})
            self.report(seq, "prompt_trained_twice",
                        f"step {step} trained prompts {compact_ranges(again)}, already trained "
                        f"by step{'s' if len(steps) > 1 else ''} {compact_ranges(steps)}")
        both = (trained & (dropped | prompts.dropped.keys())) | (dropped & prompts.trained.keys())
        if both:
            self.report(seq, "prompt_trained_and_dropped",
                        f"prompts {compact_ranges(both)} are both trained and dropped")
        outside = sorted(i for i in trained | dropped if i < 0 or i >= batch.next_index)
        if outside:
            self.report(seq, "prompt_past_stream",
                        f"step {step} settled prompts {compact_ranges(outside)}, outside the "
                        f"stream it records (0..{batch.next_index - 1})")

    def _check_resume(self, event: Event, state: RunState) -> None:
        prompts = state.prompts
        carried = _count(event.payload.get("prompts_carried_over"))
        position = _count(event.payload.get("next_prompt_index"))
        in_flight = len(prompts.in_flight)
        if carried is not None and carried != in_flight:
            self.report(event.seq, "prompt_carry_over",
                        f"resume carried over {carried} prompts; the ledger had {in_flight} "
                        "in flight")
        if position is not None and position != prompts.next_index:
            self.report(event.seq, "prompt_carry_over",
                        f"resume continued the prompt stream at {position}; the ledger's "
                        f"position was {prompts.next_index}")

    def _check_balance(self, event: Event, state: RunState) -> None:
        prompts = state.prompts
        trained, dropped = len(prompts.trained), len(prompts.dropped)
        in_flight = len(prompts.in_flight)
        if trained + dropped + in_flight != prompts.issued:
            self.report(event.seq, "prompt_balance",
                        f"issued {prompts.issued} != trained {trained} + dropped {dropped} + "
                        f"in flight {in_flight}")
        unaccounted = _count(event.payload.get("prompts_unaccounted"))
        if unaccounted:
            self.report(event.seq, "prompt_balance",
                        f"the rollout manager counted {unaccounted} prompts unaccounted for")
        issued = _count(event.payload.get("prompts_issued"))
        declared = _count(event.payload.get("prompts_in_flight"))
        if issued is not None and declared is not None and issued != trained + dropped + declared:
            self.report(event.seq, "prompt_balance",
                        f"producer issued {issued} != trained {trained} + dropped {dropped} + "
                        f"in flight {declared} (producer's count)")
