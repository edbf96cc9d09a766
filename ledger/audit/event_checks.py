"""The checks one run's events must pass as they stream past in seq order (DESIGN section 4).

(1) gapless seq and an intact hash chain, (2) committed versions 1..k in seq order, (3) epochs
that only grow and publisher events carrying the epoch current at their seq, (4) commits only
after a promotion of their cell and never from a fenced epoch, (5) engines stamped only with
committed versions, (6) the negative-staleness count a finished run reports, and (7) the
provenance of every training step and the prompt account (:mod:`ledger.audit.provenance_checks`).
Beside these: the rows the append derives from payloads (:mod:`ledger.audit.derived_checks`),
a first event that is ``run_started``, known kinds, a non-null idempotency key
that no other event of the run holds, no credential in any payload, and every witness at its
seq.

Every payload is re-validated against its kind's model (``payload_invalid``), whatever the
kind. The checker folds each event into its compact state (:class:`~ledger.audit.state.AuditState`)
after checking it, so the table checks in :mod:`ledger.audit` compare the head row with the
replay, and an audit can start from a stored state (``verify --since-verified``): given one,
the checker continues from it, and idempotency keys are checked against the earlier events by
``earlier_keys`` (the earlier events holding a key of the tail, found by one indexed query)
instead of a map of every key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.audit.derived_checks import DerivedRowChecker
from ledger.audit.provenance_checks import ProvenanceChecker
from ledger.audit.state import AuditState
from ledger.events import (
    PUBLISHER_KINDS,
    UNKNOWN_PREV_HASH,
    Event,
    EventKind,
    canonical_json,
    hash_matches,
)
from ledger.payloads import payload_problem
from ledger.redact import contains_secret
from ledger.audit.report import Problem
from ledger.audit.witness import Witness, compare

__all__ = ["EventChecker"]

_KNOWN_KINDS = {kind.value for kind in EventKind}
_PUBLISHER_KIND_VALUES = {kind.value for kind in PUBLISHER_KINDS}


class EventChecker:
    """Checks one run's events, in seq order, and folds them into :attr:`state`."""

    def __init__(self, run_id: str, witnesses: Iterable[Witness] = (),
                 start: AuditState | None = None,
                 earlier_keys: Mapping[str, int] | None = None,
                 version_uses: dict[int, dict[int, tuple]] | None = None) -> None:
        self.run_id = run_id
        self.state = start if start is not None else AuditState()
        self.problems: list[Problem] = []
        self.expected_seq = self.state.progress.last_seq + 1
        self.prev_hash = self.state.progress.head_hash
        self.first_event: Event | None = None
        self.key_seqs: dict[str, int] = {}
        self._earlier_keys = earlier_keys or {}
        self.witnesses: dict[int, list[Witness]] = {}
        self.provenance = ProvenanceChecker(self.problem)
        self.derived = DerivedRowChecker(self.problem, version_uses or {})
        self.hash_ok = True
        for witness in witnesses:
            self.witnesses.setdefault(witness.seq, []).append(witness)

    def problem(self, seq: int, check: str, message: str) -> None:
        self.problems.append(Problem(self.run_id, seq, check, message))

    def check(self, event: Event) -> None:
        """Check one event (the next in seq order), then fold it into :attr:`state`."""
        if self.first_event is None:
            self.first_event = event
        if self.state.first_kind is None:
            self.state.first_kind = event.kind
        payload_json = self._check_chain(event)
        self._check_key(event)
        if contains_secret(event.payload, payload_json):
            self.problem(
                event.seq, "credential",
                f"{event.kind} payload holds a password (it cannot be scrubbed without "
                "breaking the chain: rotate that password)",
            )
        if event.kind not in _KNOWN_KINDS:
            self.problem(event.seq, "unknown_kind", f"unknown event kind {event.kind!r}")
            self.state.progress.apply(event)  # the head moves past it (no head_mismatch)
            self._check_witnesses(event)
            return
        if event.seq == 1 and event.kind != EventKind.RUN_STARTED:
            self.problem(event.seq, EventKind.RUN_STARTED.value, f"first event is {event.kind}")
        if event.kind != EventKind.BATCH_TRAINED:  # batch_malformed names a bad batch
            invalid = payload_problem(event.kind, event.payload)
            if invalid is not None:
                self.problem(event.seq, "payload_invalid", f"{event.kind}: {invalid}")
        if event.kind == EventKind.CELL_PROMOTED:
            self._check_promotion(event)
        if event.kind in _PUBLISHER_KIND_VALUES:
            self._check_publisher_event(event)
        if event.kind == EventKind.WEIGHT_COMMITTED:
            self._check_commit(event)
        elif event.version is not None:
            self.problem(event.seq, "version", f"{event.kind} carries version {event.version}")
        if event.kind == EventKind.ENGINES_STAMPED:
            self._check_stamp(event)
        if event.kind == EventKind.RUN_FINISHED:
            negative = event.payload.get("negative_staleness_total", 0)
            if negative:
                self.problem(
                    event.seq, "negative_staleness", f"{negative} negative staleness values"
                )
        self.provenance.check(event, self.state.progress)
        if self.hash_ok:  # a tampered payload is named; its copies cannot be judged by it
            self.derived.check(
                event, self.provenance.parsed if event.kind == EventKind.BATCH_TRAINED else None)
        else:
            self.derived.uses.pop(event.seq, None)
        self._fold(event)
        self._check_witnesses(event)

    def _fold(self, event: Event) -> None:
        progress = self.state.progress
        if event.kind == EventKind.BATCH_TRAINED:
            progress.apply_batch_event(event, self.provenance.parsed)
        else:
            progress.apply(event)

    def finish(self) -> None:
        """After the last event: the derived rows left unmatched, and witnesses past the end
        (they saw a ledger not here any more)."""
        self.derived.finish()
        for seq in sorted(self.witnesses):
            if seq > self.state.progress.last_seq:
                for witness in self.witnesses[seq]:
                    self.problems.append(_behind(witness, self.state))
        self.witnesses.clear()

    def _check_chain(self, event: Event) -> str:
        """Check the event's place in the chain and its hash; returns its canonical payload
        JSON."""
        if event.seq != self.expected_seq:
            self.problem(
                event.seq, "seq_gap", f"expected seq {self.expected_seq}, found {event.seq}"
            )
        if event.prev_hash != self.prev_hash:
            self.problem(event.seq, "hash_chain", "prev_hash does not match the previous event")
        if event.prev_hash == UNKNOWN_PREV_HASH:
            # The row before is missing: the break is named above, and the hash, chained to
            # a row not here, cannot be judged.
            self.hash_ok = True
            self.expected_seq = event.seq + 1
            self.prev_hash = event.hash
            return canonical_json(event.payload)
        self.hash_ok, payload_json = hash_matches(event)
        if not self.hash_ok:
            self.problem(
                event.seq, "hash_mismatch",
                "stored hash does not match the event's contents (tampered or corrupt)",
            )
        self.expected_seq = event.seq + 1
        self.prev_hash = event.hash
        return payload_json

    def _check_key(self, event: Event) -> None:
        key = event.idempotency_key
        if key is None:
            self.problem(
                event.seq, "null_idempotency_key",
                f"{event.kind} has no idempotency key (a retry of it could be written twice)",
            )
        elif key in self.key_seqs:
            self._duplicate_key(event.seq, key, self.key_seqs[key])
        else:
            self.key_seqs[key] = event.seq
            if key in self._earlier_keys:
                self._duplicate_key(event.seq, key, self._earlier_keys[key])

    def _duplicate_key(self, seq: int, key: str, first_seq: int) -> None:
        self.problem(seq, "duplicate_idempotency_key",
                     f"idempotency key {key!r} already names seq {first_seq}")

    def _check_promotion(self, event: Event) -> None:
        expected = self.state.progress.epoch + 1
        if event.epoch != expected:
            self.problem(
                event.seq, "epoch_order",
                f"promotion of cell {event.cell_id} to epoch {event.epoch}; expected {expected}",
            )
        if event.cell_id:
            self.state.promoted_cells.add(event.cell_id)

    def _check_publisher_event(self, event: Event) -> None:
        progress = self.state.progress
        if event.cell_id not in self.state.promoted_cells:
            self.problem(
                event.seq, "no_promotion",
                f"{event.kind} from cell {event.cell_id} that was never promoted",
            )
        elif event.epoch != progress.epoch or event.cell_id != progress.publisher_cell:
            self.problem(
                event.seq, "fenced_write",
                f"{event.kind} from cell {event.cell_id} epoch {event.epoch}; publisher is "
                f"cell {progress.publisher_cell} epoch {progress.epoch}",
            )

    def _check_commit(self, event: Event) -> None:
        expected = self.state.progress.head_version + 1
        if event.version != expected:
            self.problem(
                event.seq, "version_order",
                f"committed version {event.version}; expected {expected}",
            )

    def _check_stamp(self, event: Event) -> None:
        version = event.payload.get("version")
        committed = isinstance(version, int) and not isinstance(version, bool) \
            and 0 <= version <= self.state.progress.head_version
        if not committed:
            self.problem(
                event.seq, "stamp_uncommitted",
                f"engines stamped with version {version}, which is not committed",
            )

    def _check_witnesses(self, event: Event) -> None:
        for witness in self.witnesses.pop(event.seq, ()):
            problem = compare(witness, event, self.state.progress.head_version)
            if problem is not None:
                self.problems.append(problem)


def _behind(witness: Witness, state: AuditState) -> Problem:
    problem = compare(witness, None, None)
    assert problem is not None
    return Problem(
        problem.run_id, problem.seq, problem.check,
        f"{witness.describe()}, but the ledger's events end at seq {state.progress.last_seq} "
        f"(version {state.progress.head_version}): it is older than what the run wrote (restored from a "
        "backup?); resuming would reuse versions",
    )
