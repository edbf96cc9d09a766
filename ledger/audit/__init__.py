"""verify(): replay every run and cross-check every table; report each broken invariant.

The audit reads one consistent view of the ledger (``Ledger.snapshot()``: one read
transaction, ``REPEATABLE READ READ ONLY`` on PostgreSQL), so it never mistakes a writer's
progress between two of its reads for damage. It looks at every run id that any table holds,
so a run cannot vanish from the audit by losing a row:

- each run's events stream through :class:`~ledger.audit.event_checks.EventChecker` (hash chain,
  versions, epochs, fencing, stamps, idempotency keys, credentials, witnesses, and the
  provenance of each training step with the prompt account: :mod:`ledger.audit.provenance_checks`);
- ``runs`` rows, ``run_heads`` rows and events must all exist for a run (``no_run_row``,
  ``no_head_row``, ``no_events``);
- the head row must equal the replay (``head_mismatch``);
- each event's ``train_step`` column and each step's ``version_uses`` rows must equal what
  its payload says (``train_step_column``, ``version_uses_mismatch``:
  :mod:`ledger.audit.derived_checks`);
- ``runs.config`` must equal the config hashed into ``run_started`` (``config_mismatch``), and
  hold no credential.

- every read-model snapshot and audit checkpoint must hold the chain's hash at its seq
  (``snapshot_hash``, ``audit_checkpoint_hash``) and the state the replay has there
  (``snapshot_mismatch``, ``audit_checkpoint_mismatch``).

With ``since_verified`` the audit starts from the run's newest audit checkpoint whose hash is
still the chain's hash at its seq (its state restored, :mod:`ledger.audit.state`), so it costs
O(events since then); a checkpoint that fails that test is skipped (and named: the stream
checks every stored state after the start), and without a usable one the whole run is checked.
What a trusted checkpoint's state claims is re-checked only by a full verify. The report carries each
run's final state (``final_states``), which a writer stores as the next checkpoint when the run
audits clean.

A committed version that no ``engines_stamped`` event names is not a problem: it is what a
death between commit and stamp leaves, and it is reported as a note. The audit imports no
store: it reads through :class:`AuditSource`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ledger.errors import LedgerError, UnknownRunError
from ledger.audit.event_checks import EventChecker
from ledger.audit.state import AuditState
from ledger.events import Event, RunRecord, canonical_json
from ledger.progress import READABLE_FORMATS, STATE_FORMAT as PROGRESS_FORMAT
from ledger.redact import contains_secret
from ledger.audit.report import AuditReport, Problem
from ledger.audit.witness import BEHIND, Witness, describe_missing_run

__all__ = ["AuditReport", "AuditSource", "Problem", "verify"]


class AuditSource(Protocol):
    """What the audit reads: one consistent view of the ledger (``Ledger.snapshot()``)."""

    def records(self) -> Sequence[RunRecord]:
        """Every run id any table holds, with what each table holds for it."""

    def run_record(self, run_id: str) -> RunRecord | None:
        """What the tables hold for one run id (None: nothing)."""

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterable[Event]:
        """The run's events in seq order."""

    def stored_states(self, table: str, run_id: str) -> list[tuple[int, str, Any]]:
        """(seq, head_hash, state) of the run's snapshots or audit checkpoints."""

    def latest_audit_checkpoint(self, run_id: str, max_seq: int
                                ) -> tuple[int, str, Any] | None:
        """The newest audit checkpoint at or below ``max_seq``."""

    def event_hash_at(self, run_id: str, seq: int) -> str | None:
        """The stored hash of the event at ``seq``."""

    def earlier_keys(self, run_id: str, from_seq: int) -> dict[str, int]:
        """key -> seq of events below ``from_seq`` whose key an event from ``from_seq`` on
        holds too."""

    def version_uses_from(self, run_id: str, first_seq: int = 1) -> dict[int, dict[int, tuple]]:
        """seq -> {version: (train_step, samples)} of ``version_uses`` rows from ``first_seq``."""


_STORED = (("projection_snapshots", "snapshot"), ("audit_checkpoints", "audit_checkpoint"))


def verify(
    source: AuditSource, run_id: str | None = None, witnesses: Iterable[Witness] = (),
    *, since_verified: bool = False,
) -> AuditReport:
    """Audit every run of ``source`` (or only ``run_id``), and check ``witnesses`` against it.

    The runs that witnesses name are audited too. Reads only; never raises for a bad row (an
    undecodable row is the problem ``unreadable``).

    Raises:
        UnknownRunError: ``run_id`` is in no table of the ledger.
        LedgerUnavailableError: the database could not be reached.
    """
    by_run: dict[str, list[Witness]] = {}
    for witness in witnesses:
        by_run.setdefault(witness.run_id, []).append(witness)
    records = _select(source, run_id, set(by_run))
    report = AuditReport(run_ids=[record.run_id for record in records])
    for record in records:
        start = _checkpoint(source, record) if since_verified else None
        checker = EventChecker(
            record.run_id, by_run.pop(record.run_id, ()), start,
            None if start is None else
            source.earlier_keys(record.run_id, start.progress.last_seq + 1),
            source.version_uses_from(
                record.run_id, 1 if start is None else start.progress.last_seq + 1),
        )
        report.verified_from[record.run_id] = checker.expected_seq
        report.witnesses_checked += len(checker.witnesses)
        checked, readable = _stream(source, record, checker)
        report.events_checked += checked
        report.problems.extend(checker.problems)
        report.problems.extend(_table_problems(record, checker, readable))
        if readable:
            progress = checker.state.progress
            report.final_states[record.run_id] = (
                progress.last_seq, progress.head_hash, checker.state)
        if checker.state.unstamped_versions:
            report.unstamped[record.run_id] = checker.state.unstamped_versions
    for missing_run, unseen in by_run.items():  # witnesses of runs the ledger never heard of
        report.witnesses_checked += len(unseen)
        report.problems.extend(
            Problem(missing_run, witness.seq, BEHIND, describe_missing_run(witness))
            for witness in unseen
        )
    return report


def _select(source: AuditSource, run_id: str | None, witnessed: set[str]) -> list[RunRecord]:
    if run_id is None:
        return list(source.records())
    wanted = [run_id] + sorted(witnessed - {run_id})
    records = []
    for rid in wanted:
        record = source.run_record(rid)
        if record is None and rid == run_id:
            raise UnknownRunError(run_id)
        if record is not None:
            records.append(record)
    return records


def _checkpoint(source: AuditSource, record: RunRecord, tries: int = 16) -> AuditState | None:
    """The run's newest usable audit checkpoint (its hash is the chain's at its seq, its state
    reads back), looking back past up to ``tries`` unusable ones (the stream names each), or
    None: verify everything."""
    max_seq = record.head.seq if record.head is not None else (record.last_event_seq or 0)
    for _ in range(tries):
        found = source.latest_audit_checkpoint(record.run_id, max_seq)
        if found is None:
            return None
        seq, head_hash, state = found
        max_seq = seq - 1
        if source.event_hash_at(record.run_id, seq) != head_hash:
            continue  # a forged or stale checkpoint
        try:
            start = AuditState.from_json(state)
        except (KeyError, TypeError, ValueError):
            continue
        if start.progress.last_seq == seq and start.progress.head_hash == head_hash:
            return start
    return None


def _stream(source: AuditSource, record: RunRecord, checker: EventChecker) -> tuple[int, bool]:
    """Feed the run's events (from the checker's start) to ``checker``, and check each stored
    snapshot and checkpoint at its seq: how many events were checked, and whether all could be
    read."""
    checked = 0
    first = checker.expected_seq
    try:
        stored: dict[int, list[tuple[str, str, Any]]] = {}
        for table, check in _STORED:
            for seq, head_hash, state in source.stored_states(table, record.run_id):
                if seq >= first:
                    stored.setdefault(seq, []).append((check, head_hash, state))
        for event in source.events(record.run_id, first):
            checker.check(event)
            checked += 1
            for check, head_hash, state in stored.pop(event.seq, ()):
                _check_stored(checker, event, check, head_hash, state)
    except LedgerError as exc:
        checker.problem(checker.expected_seq, "unreadable", str(exc))
        checker.witnesses.clear()  # what is past an unreadable row cannot be judged
        return checked, False
    for seq, entries in sorted(stored.items()):
        for check, _, _ in entries:
            checker.problem(seq, f"{check}_hash", f"a stored {check.replace('_', ' ')} names "
                            f"seq {seq}, past the run's last event")
    checker.finish()
    return checked, True


def _check_stored(checker: EventChecker, event: Event, check: str, head_hash: str,
                  state: Any) -> None:
    what = check.replace("_", " ")
    if head_hash != event.hash:
        checker.problem(event.seq, f"{check}_hash", f"the {what} at seq {event.seq} holds hash "
                        f"{str(head_hash)[:12]}, not the chain's {event.hash[:12]}")
        return
    folded = _folded_as(checker, check, state)
    if state != folded:
        differing = sorted(key for key in folded if not isinstance(state, dict)
                           or state.get(key) != folded[key])
        checker.problem(event.seq, f"{check}_mismatch", f"the {what} at seq {event.seq} "
                        f"disagrees with the replay ({', '.join(differing[:6]) or 'format'})")


def _folded_as(checker: EventChecker, check: str, state: Any) -> dict[str, Any]:
    """The replay's state in the progress format the stored ``state`` was written in (a
    snapshot of an older format that still reads back is compared in its own form)."""
    progress = state if check == "snapshot" else (
        state.get("progress") if isinstance(state, dict) else None)
    written = progress.get("format") if isinstance(progress, dict) else None
    progress_format = written if written in READABLE_FORMATS else PROGRESS_FORMAT
    if check == "snapshot":
        return checker.state.progress.to_json(progress_format)
    return checker.state.to_json(progress_format)


def _table_problems(record: RunRecord, checker: EventChecker, readable: bool) -> list[Problem]:
    """The run's rows in ``runs`` and ``run_heads`` against each other and the replay."""
    state = checker.state.progress
    run_id = record.run_id
    last_seq = state.last_seq or (record.head.seq if record.head else 0)
    problems: list[Problem] = []
    if not record.has_run_row:
        holders = ", ".join(
            name for name, present in (
                ("a head row", record.head is not None), ("events", state.last_seq > 0),
            ) if present
        )
        problems.append(Problem(
            run_id, last_seq, "no_run_row",
            f"run {run_id} has {holders} but no runs row (deleted, or events forged for it)",
        ))
    if record.head is None:
        problems.append(Problem(
            run_id, last_seq, "no_head_row",
            f"run {run_id} has no head row (writers cannot lock it; `ledger runs` marks it "
            "broken)",
        ))
    if record.last_event_seq is None:
        problems.append(Problem(run_id, last_seq, "no_events", f"run {run_id} has no events"))
    elif record.head is not None and readable:
        head = record.head
        derived = (state.last_seq, state.head_version, state.epoch, state.publisher_cell,
                   state.head_hash)
        stored = (head.seq, head.version, head.epoch, head.publisher_cell, head.hash)
        if derived != stored:
            problems.append(Problem(
                run_id, head.seq, "head_mismatch",
                f"head row says seq/version/epoch/publisher {stored[:4]}, "
                f"events say {derived[:4]}",
            ))
    problems.extend(_config_problems(record, checker.first_event))
    return problems


def _config_problems(record: RunRecord, first: Event | None) -> list[Problem]:
    """``runs.config`` is outside the hash chain: it must equal the hashed ``run_started``."""
    if record.config is None:
        return []
    problems = []
    if contains_secret(record.config):
        problems.append(Problem(
            record.run_id, 1, "credential",
            "runs.config holds a password (rotate that password)",
        ))
    if first is None or first.seq != 1 or "config" not in first.payload:
        return problems  # a missing or foreign first event is reported by the event checks
    hashed = first.payload["config"]
    if canonical_json(record.config) != canonical_json(hashed):
        changed: list[str] = []
        if isinstance(record.config, dict) and isinstance(hashed, dict):
            changed = sorted(
                str(key) for key in record.config.keys() | hashed.keys()
                if record.config.get(key) != hashed.get(key)
            )
        problems.append(Problem(
            record.run_id, 1, "config_mismatch",
            "runs.config differs from the config hashed in run_started"
            + (f" (keys: {', '.join(changed[:10])})" if changed else ""),
        ))
    return problems
