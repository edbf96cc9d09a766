"""The audit's provenance checks: each ``batch_trained`` against the ledger at its seq, and the
prompt account of a finished run.

Called by :class:`ledger.audit.event_checks.EventChecker` before it folds the event, so "the
ledger at its seq" is the run's :class:`~ledger.progress.Progress` as of the previous event.
Every field a payload claims is re-derived from the ledger's own rows. Every check names its
problem by run and seq:

- ``batch_malformed``: a ``batch_trained`` payload that does not fit its model (not folded);
- ``step_twice``: a train step recorded by a second ``batch_trained``;
- ``version_above_head``: a step that trained on samples of a version above the head (or held
  one), which no engine could have served yet;
- ``produced_uncommitted``: a ``produced_version`` that is not a committed version;
- ``negative_staleness``: a step whose staleness min is below 0 (DESIGN invariant 6);
- ``samples_mismatch``: ``samples`` is not the sum of ``sample_versions``;
- ``staleness_mismatch``: ``staleness`` min/avg/max that no one drain version gives for the
  step's ``sample_versions`` (staleness is ``drain version - oldest version`` per sample, so
  ``max - min`` is the span of the versions and ``avg`` follows from their mean);
- ``prompt_digest_mismatch``: a ``prompt_digest`` that is not the digest of the prompts the
  step records as trained;
- ``prompt_trained_twice``, ``prompt_trained_and_dropped``: a prompt settled twice;
- ``prompt_past_stream``: a trained or dropped prompt id at or past the stream position the
  same event records (or below 0): a prompt that was never issued;
- ``prompt_carry_over``: a ``run_resumed`` whose ``prompts_carried_over`` or
  ``next_prompt_index`` differs from the ledger's account at its seq (prompts lost or skipped);
- ``resume_ledger_step``: a ``run_resumed`` whose ``ledger_step`` is not the ledger's last
  trained step at its seq;
- ``prompt_balance`` (at each ``run_finished``): issued == trained + dropped + in flight, with
  in flight the issued prompts neither trained nor dropped (carried-over prompts among them),
  ``prompts_unaccounted`` (the rollout manager's own count) zero, and, when the event carries
  the producer's ``prompts_issued`` and ``prompts_in_flight``, the same equation with those.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.audit.report import compact_ranges
from ledger.events import Event, EventKind
from ledger.progress import Progress
from ledger.provenance import BatchView, parse_batch, stored_prompt_digest

__all__ = ["ProvenanceChecker"]

Report = Callable[[int, str, str], None]
_AVG_TOLERANCE = 1e-3  # the recorder rounds avg to 4 places


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    """Ranges as ``compact_ranges`` writes them, without expanding a (possibly forged) huge one."""
    if sum(end - start + 1 for start, end in ranges) <= 10_000:
        return compact_ranges(i for start, end in ranges for i in range(start, end + 1))
    return ", ".join(f"{start}-{end}" for start, end in sorted(set(ranges))[:20])


class ProvenanceChecker:
    """Checks ``batch_trained``, ``run_resumed`` and ``run_finished`` events against the
    progress folded so far; ``report(seq, check, message)`` records each problem. ``parsed``
    is the last ``batch_trained`` parsed (the checker folds it without parsing it again)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.parsed: BatchView | None = None

    def check(self, event: Event, state: Progress) -> None:
        """Check one event (before it is folded into ``state``)."""
        if event.kind == EventKind.BATCH_TRAINED:
            self.parsed = batch = parse_batch(event)
            if batch is None:
                self.report(event.seq, "batch_malformed",
                            "batch_trained payload does not fit its model (not folded)")
                return
            self._check_batch(batch, state)
            self._check_claims(event, batch)
        elif event.kind == EventKind.RUN_RESUMED:
            self._check_resume(event, state)
        elif event.kind == EventKind.RUN_FINISHED:
            self._check_balance(event, state)

    def _check_batch(self, batch: BatchView, state: Progress) -> None:
        seq, step = batch.seq, batch.train_step
        if step in state.steps:
            self.report(seq, "step_twice", f"train step {step} already recorded by an earlier "
                        "batch_trained")
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
        if produced is not None and not 1 <= produced <= state.head_version:
            self.report(seq, "produced_uncommitted",
                        f"step {step} produced version {produced}, which is not committed")
        if batch.staleness_min < 0:
            self.report(seq, "negative_staleness",
                        f"step {step} staleness min {batch.staleness_min} (a sample newer than "
                        "the version it was measured against)")
        self._check_prompts(batch, state)

    def _check_claims(self, event: Event, batch: BatchView) -> None:
        """Fields the payload derives from others: samples, staleness, the prompt digest."""
        seq, step, versions = batch.seq, batch.train_step, batch.sample_versions
        counted = sum(versions.values())
        if versions and counted != batch.samples:
            self.report(seq, "samples_mismatch", f"step {step} records {batch.samples} samples; "
                        f"its sample_versions count {counted}")
        if versions and counted > 0:
            drain = batch.staleness_max + min(versions)  # staleness = drain - oldest version
            mean = sum(version * count for version, count in versions.items()) / counted
            derived = (drain - max(versions), drain - mean)
            if batch.staleness_min != derived[0] \
                    or abs(batch.staleness_avg - derived[1]) > _AVG_TOLERANCE:
                self.report(seq, "staleness_mismatch",
                            f"step {step} staleness min/avg/max {batch.staleness_min}/"
                            f"{batch.staleness_avg}/{batch.staleness_max} does not follow from "
                            f"its sample_versions (min {derived[0]}, avg {derived[1]:.4f})")
        trained = event.payload.get("prompts", {}).get("trained")
        if stored_prompt_digest(trained, batch.trained_ranges) != batch.prompt_digest:
            self.report(seq, "prompt_digest_mismatch",
                        f"step {step} prompt_digest is not the digest of the prompts it "
                        "records as trained")

    def _check_prompts(self, batch: BatchView, state: Progress) -> None:
        seq, step, prompts = batch.seq, batch.train_step, state.prompts
        again: list[tuple[int, int]] = []
        both: list[tuple[int, int]] = []
        for start, end in batch.trained_ranges:
            again += [(s, e) for s, e, _ in prompts.trained.overlaps(start, end)]
            both += [(s, e) for s, e, _ in prompts.dropped.overlaps(start, end)]
            for ranges in batch.dropped_ranges.values():
                both += [(max(start, s), min(end, e)) for s, e in ranges
                         if s <= end and e >= start]
        for ranges in batch.dropped_ranges.values():
            for start, end in ranges:
                both += [(s, e) for s, e, _ in prompts.trained.overlaps(start, end)]
        if again:
            self.report(seq, "prompt_trained_twice",
                        f"step {step} trained prompts {_ranges_text(again)}, already "
                        "trained by an earlier step")
        if both:
            self.report(seq, "prompt_trained_and_dropped",
                        f"prompts {_ranges_text(both)} are both trained and dropped")
        settled = list(batch.trained_ranges) + [
            pair for ranges in batch.dropped_ranges.values() for pair in ranges]
        outside = []
        for start, end in settled:
            if start < 0:
                outside.append((start, min(end, -1)))
            if end >= batch.next_index:
                outside.append((max(start, batch.next_index), end))
        if outside:
            self.report(seq, "prompt_past_stream",
                        f"step {step} settled prompts {_ranges_text(outside)}, outside the "
                        f"stream it records (0..{batch.next_index - 1})")

    def _check_resume(self, event: Event, state: Progress) -> None:
        prompts = state.prompts
        carried = _count(event.payload.get("prompts_carried_over"))
        position = _count(event.payload.get("next_prompt_index"))
        ledger_step = _count(event.payload.get("ledger_step"))
        in_flight = prompts.in_flight_count
        if carried is not None and carried != in_flight:
            self.report(event.seq, "prompt_carry_over",
                        f"resume carried over {carried} prompts; the ledger had {in_flight} "
                        "in flight")
        if position is not None and position != prompts.next_index:
            self.report(event.seq, "prompt_carry_over",
                        f"resume continued the prompt stream at {position}; the ledger's "
                        f"position was {prompts.next_index}")
        if ledger_step is not None and ledger_step != prompts.last_step:
            self.report(event.seq, "resume_ledger_step",
                        f"resume records ledger step {ledger_step}; the ledger's last trained "
                        f"step was {prompts.last_step}")

    def _check_balance(self, event: Event, state: Progress) -> None:
        prompts = state.prompts
        trained, dropped = len(prompts.trained), len(prompts.dropped)
        in_flight = prompts.in_flight_count
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
