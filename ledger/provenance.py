"""Provenance read model: what each training step trained, and where every prompt is.

Each training step appends one driver-recorded ``batch_trained`` event (payload model
:class:`ledger.payloads.BatchTrained`): the versions its samples were generated under (oldest
version per sample), staleness, groups and samples, a digest of the prompt ids trained, and the
prompts the step settled (trained, dropped by reason) with the prompt stream's position after
it. ``run_resumed`` adds what a resume carried over (``prompts_carried_over``,
``next_prompt_index``, ``ledger_step``).

:class:`Provenance` folds those events, in seq order, into:

- ``batches``: train step -> :class:`BatchView` (the first event recorded for that step; a
  second one is what :mod:`ledger.audit.provenance_checks` reports);
- ``trained_on``: version -> {train step: samples generated under that version};
- ``prompts``: the run's :class:`PromptLedger` (issued, trained, dropped by reason, recycled,
  in flight).

:class:`ledger.projections.RunState` holds one and exposes its parts as ``state.batches``,
``state.trained_on`` and ``state.prompts``. The fold never raises on a malformed payload (it is
skipped and counted in ``malformed``; the audit names it), so a damaged ledger still answers.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


from ledger.events import Event, EventKind, read_payload
from ledger.id_ranges import IdMap, gaps_between, iter_ranges

__all__ = [
    "BatchView",
    "PromptLedger",
    "Provenance",
    "parse_batch",
    "prompt_digest",
    "prompt_ledger",
    "stored_prompt_digest",
]


def prompt_digest(prompt_ids: Iterable[int]) -> str:
    """sha256 over the sorted prompt ids of a step (match a step's exact inputs later)."""
    return _digest_of(_decimal_list(sorted(prompt_ids)))


def stored_prompt_digest(trained: object, ranges: Iterable[tuple[int, int]]) -> str:
    """The :func:`prompt_digest` of a stored ``prompts.trained``: over the flat list as it is
    (duplicates included, as the writer digested it) if it is one, else over the ranges."""
    if isinstance(trained, list) and all(type(item) is int for item in trained):
        return prompt_digest(trained)
    return _digest_of(",".join(_decimal_list(range(start, end + 1))
                               for start, end in sorted(ranges)))


def _decimal_list(ids: Sequence[int]) -> str:
    # "0,1,2": one %-format of the whole run, which renders the integers in C (the audit
    # digests every step's ids; a join over str() of each costs about 1.5x as much).
    return (("%d," * len(ids)) % tuple(ids))[:-1]


def _digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class BatchView:
    """One training step, as its ``batch_trained`` event recorded it."""

    train_step: int
    seq: int
    recorded_at: datetime
    trainer_version: int
    produced_version: int | None
    cells: tuple[str, ...]
    groups: int
    samples: int
    sample_versions: dict[int, int]  # version -> samples whose oldest version it is
    token_version_span_max: int
    mixed_version_samples: int
    staleness_min: int
    staleness_avg: float
    staleness_max: int
    prompt_digest: str
    trained_ranges: tuple[tuple[int, int], ...]  # (start, end), both included
    dropped_ranges: dict[str, tuple[tuple[int, int], ...]]
    recycled: int
    next_index: int

    @property
    def prompts_trained(self) -> tuple[int, ...]:
        """Every prompt id the step trained (expanded from its ranges)."""
        return tuple(i for start, end in self.trained_ranges for i in range(start, end + 1))

    @property
    def prompts_dropped(self) -> dict[str, tuple[int, ...]]:
        """Reason -> every prompt id the step dropped for it (expanded)."""
        return {reason: tuple(i for start, end in ranges for i in range(start, end + 1))
                for reason, ranges in self.dropped_ranges.items()}

    @property
    def trained_count(self) -> int:
        """How many prompts the step trained."""
        return sum(end - start + 1 for start, end in self.trained_ranges)

    @property
    def newest_sample_version(self) -> int | None:
        """The newest version any sample of the step was generated under (None: no samples)."""
        return max(self.sample_versions, default=None)


def parse_batch(event: Event) -> BatchView | None:
    """The :class:`BatchView` of a ``batch_trained`` event, or None if its payload does not fit
    :class:`ledger.payloads.BatchTrained` (planted or corrupt rows; the audit reports them)."""
    from ledger.payloads import BatchTrained  # the models, on first use

    try:
        payload = read_payload(event.payload, BatchTrained)
        versions = {int(version): int(count)
                    for version, count in payload.sample_versions.items()}
    except (ValueError, TypeError):  # msgspec.ValidationError is a ValueError
        return None
    prompts = payload.prompts
    return BatchView(
        train_step=payload.train_step,
        seq=event.seq,
        recorded_at=event.recorded_at,
        trainer_version=payload.trainer_version,
        produced_version=payload.produced_version,
        cells=tuple(payload.cells),
        groups=payload.groups,
        samples=payload.samples,
        sample_versions=dict(sorted(versions.items())),
        token_version_span_max=payload.token_version_span_max,
        mixed_version_samples=payload.mixed_version_samples,
        staleness_min=payload.staleness.min,
        staleness_avg=payload.staleness.avg,
        staleness_max=payload.staleness.max,
        prompt_digest=payload.prompt_digest,
        trained_ranges=tuple(iter_ranges(prompts.trained)),
        dropped_ranges={reason: tuple(iter_ranges(ids)) for reason, ids in prompts.dropped.items()},
        recycled=prompts.recycled,
        next_index=prompts.next_index,
    )


@dataclass
class PromptLedger:
    """Where every prompt of a run is, according to its ``batch_trained`` events.

    ``next_index`` is the prompt stream's position (prompts ``0 .. next_index - 1`` were
    issued). A prompt is trained (by the first step that recorded it), dropped (with the first
    reason recorded), or in flight (issued, neither: generating, queued, or pending a resume).
    ``trained`` (prompt -> the step that trained it) and ``dropped`` (prompt -> reason) are
    :class:`~ledger.id_ranges.IdMap` s held as ranges: one entry per step's contiguous run of
    prompts, not one per prompt, so the account (and a snapshot of it) is bounded by steps and
    gaps, not by the batch size.
    """

    next_index: int = 0
    trained: IdMap[int] = field(default_factory=IdMap)  # prompt -> train step
    dropped: IdMap[str] = field(default_factory=IdMap)  # prompt -> reason
    recycled: int = 0
    last_step: int = 0
    carried_over: int = 0  # prompts in flight at resumes, summed over every resume
    resumes: int = 0
    twice: list[int] = field(default_factory=list)  # prompts trained by two steps (a bug)

    @property
    def issued(self) -> int:
        """Prompts issued so far (the stream's position)."""
        return self.next_index

    def in_flight_ranges(self) -> list[tuple[int, int]]:
        """The issued ids neither trained nor dropped, as ``(start, end)`` ranges (from the
        maps' blocks: bounded by the gaps, not the steps)."""
        settled = sorted(self.trained.blocks() + self.dropped.blocks())
        return list(gaps_between(settled, self.next_index))

    @property
    def in_flight(self) -> list[int]:
        """Issued prompts neither trained nor dropped (in flight, queued, or pending)."""
        return [index for start, end in self.in_flight_ranges() for index in range(start, end + 1)]

    @property
    def in_flight_count(self) -> int:
        """How many issued prompts are neither trained nor dropped."""
        return sum(end - start + 1 for start, end in self.in_flight_ranges())

    def dropped_by_reason(self) -> dict[str, int]:
        """Reason -> how many prompts were dropped for it."""
        counts: Counter[str] = Counter()
        for start, end, reason in self.dropped.ranges():
            counts[reason] += end - start + 1
        return dict(sorted(counts.items()))

    def apply_batch(self, batch: BatchView) -> None:
        """Fold one step's prompt outcomes."""
        for start, end in batch.trained_ranges:
            for clash_start, clash_end, _ in self.trained.add(start, end, batch.train_step):
                self.twice.extend(range(clash_start, clash_end + 1))
        for reason, ranges in batch.dropped_ranges.items():
            for start, end in ranges:
                self.dropped.add(start, end, reason)
        self.recycled += batch.recycled
        self.next_index = max(self.next_index, batch.next_index)
        self.last_step = max(self.last_step, batch.train_step)

    def apply_resume(self, event: Event) -> None:
        """Fold a ``run_resumed`` event (what it carried over; its stream position)."""
        self.resumes += 1
        carried = event.payload.get("prompts_carried_over")
        if isinstance(carried, int) and not isinstance(carried, bool):
            self.carried_over += carried
        position = event.payload.get("next_prompt_index")
        if isinstance(position, int) and not isinstance(position, bool):
            self.next_index = max(self.next_index, position)

    def to_json(self, progressions: bool = True) -> dict[str, Any]:
        """The account as JSON (for a read-model snapshot; :meth:`from_json` reads it back);
        ``progressions`` as in :meth:`IdMap.to_json`."""
        return {"next_index": self.next_index, "trained": self.trained.to_json(progressions),
                "dropped": self.dropped.to_json(progressions), "recycled": self.recycled,
                "last_step": self.last_step, "carried_over": self.carried_over,
                "resumes": self.resumes, "twice": list(self.twice)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptLedger:
        """The account :meth:`to_json` wrote.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such an account.
        """
        return cls(next_index=int(data["next_index"]), trained=IdMap.from_json(data["trained"]),
                   dropped=IdMap.from_json(data["dropped"]), recycled=int(data["recycled"]),
                   last_step=int(data["last_step"]), carried_over=int(data["carried_over"]),
                   resumes=int(data["resumes"]), twice=[int(i) for i in data["twice"]])

    def apply(self, event: Event) -> None:
        """Fold one event (kinds other than ``batch_trained`` and ``run_resumed`` are ignored;
        a malformed ``batch_trained`` is skipped)."""
        if event.kind == EventKind.BATCH_TRAINED:
            batch = parse_batch(event)
            if batch is not None:
                self.apply_batch(batch)
        elif event.kind == EventKind.RUN_RESUMED:
            self.apply_resume(event)


def prompt_ledger(events: Iterable[Event]) -> PromptLedger:
    """Fold a run's events (in seq order) into its :class:`PromptLedger`."""
    accounting = PromptLedger()
    for event in events:
        accounting.apply(event)
    return accounting


@dataclass
class Provenance:
    """The provenance part of the read model: steps, versions trained on, prompts."""

    batches: dict[int, BatchView] = field(default_factory=dict)
    trained_on: dict[int, dict[int, int]] = field(default_factory=dict)
    prompts: PromptLedger = field(default_factory=PromptLedger)
    malformed: list[int] = field(default_factory=list)  # seqs of unreadable batch_trained

    def apply(self, event: Event) -> BatchView | None:
        """Fold one ``batch_trained`` or ``run_resumed`` event; returns the parsed batch."""
        if event.kind == EventKind.RUN_RESUMED:
            self.prompts.apply_resume(event)
            return None
        if event.kind != EventKind.BATCH_TRAINED:
            return None
        batch = parse_batch(event)
        if batch is None:
            self.malformed.append(event.seq)
            return None
        self.prompts.apply_batch(batch)
        if batch.train_step not in self.batches:  # a repeat is an audit problem, not news
            self.batches[batch.train_step] = batch
            for version, count in batch.sample_versions.items():
                self.trained_on.setdefault(version, {})[batch.train_step] = count
        return batch

    def steps_trained_on(self, version: int) -> dict[int, int]:
        """Train step -> samples generated under ``version`` that it trained, step order."""
        return dict(sorted(self.trained_on.get(version, {}).items()))

    def fed(self, train_step: int) -> BatchView | None:
        """The batch of ``train_step``, if recorded."""
        return self.batches.get(train_step)
