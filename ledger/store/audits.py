"""The Ledger's audits and stored states: verify (whole or since the last checkpoint),
witness checks, the run's progress from its newest snapshot, and storing snapshots and
audit checkpoints (:mod:`ledger.store.states`).

A mixin of :class:`ledger.store.Ledger`: it uses the facade's engine, retries and write
transaction, and adds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from ledger.progress import Progress, load_progress
from ledger.store.reads import Reader
from ledger.store.states import store_state

if TYPE_CHECKING:
    from ledger.audit.report import AuditReport, Problem
    from ledger.audit.witness import Witness

__all__ = ["AuditReads"]

_T = TypeVar("_T")


class AuditReads:
    """Audit and snapshot methods of :class:`ledger.store.Ledger` (see its docstring)."""

    readonly: bool
    if TYPE_CHECKING:  # provided by the Ledger facade
        def _with_retries(self, operation: Callable[..., _T], *args: Any,
                          **kwargs: Any) -> _T: ...
        def snapshot(self) -> AbstractContextManager[Reader]: ...
        def _write(self) -> AbstractContextManager[sa.Connection]: ...

    def verify(
        self, run_id: str | None = None, *, witnesses: Iterable[Witness] = ()
    ) -> AuditReport:
        """Check every invariant the ledger can see (DESIGN section 4 and every table against
        the others), for every run or only ``run_id``, in one snapshot; and check
        ``witnesses`` (see :mod:`ledger.audit.witness`) against it. Retried like a read.

        Raises:
            UnknownRunError: ``run_id`` is in no table of the ledger.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        witnesses = list(witnesses)
        return self._with_retries(self._verify_once, run_id, witnesses)

    def _verify_once(self, run_id: str | None, witnesses: list[Witness],
                     since_verified: bool = False) -> AuditReport:
        from ledger import audit  # imported on first audit: readers of the head skip it

        with self.snapshot() as reader:
            return audit.verify(reader, run_id, witnesses, since_verified=since_verified)

    def verify_since_checkpoint(self, run_id: str, *, record: bool = True) -> AuditReport:
        """Audit ``run_id`` from its newest audit checkpoint (the whole run if it has none
        usable; see :func:`ledger.audit.verify`), so the cost is O(events since then); with
        ``record``, a clean audit stores its end state as the next checkpoint. Retried like a
        read.

        Raises:
            UnknownRunError: the run is in no table of the ledger.
            LedgerError: ``record`` on a read-only ledger.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        report = self._with_retries(self._verify_once, run_id, [], True)
        if record and report.ok and run_id in report.final_states:
            seq, head_hash, state = report.final_states[run_id]
            self._with_retries(self._store, "audit_checkpoints", run_id, seq, head_hash,
                               state.to_json())
        return report

    def progress(self, run_id: str) -> Progress:
        """The run's :class:`~ledger.progress.Progress` at its head: the newest snapshot whose
        hash is the chain's, plus a fold of the events after it (from event 1 without one).

        Raises:
            UnknownRunError: the run has no head row.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        return self._with_retries(self._progress_once, run_id)

    def _progress_once(self, run_id: str) -> Progress:
        with self.snapshot() as reader:
            return load_progress(reader, run_id, reader.head(run_id).seq)[0]

    def checkpoint(self, run_id: str) -> Progress:
        """Store a read-model snapshot of the run at its head and, if the events since the
        last audit checkpoint audit clean, a new audit checkpoint; returns the progress.
        Idempotent (a state already stored at a seq is kept); writes no event.

        Raises:
            LedgerError: a read-only ledger.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        progress = self.progress(run_id)
        self._with_retries(self._store, "projection_snapshots", run_id, progress.last_seq,
                           progress.head_hash, progress.to_json())
        self.verify_since_checkpoint(run_id, record=True)
        return progress

    def _store(self, table: str, run_id: str, seq: int, head_hash: str, state: dict) -> bool:
        with self._write() as conn:
            return store_state(conn, table, run_id, seq, head_hash, state)

    def witness(self, run_id: str) -> Witness:
        """The run's head as seen now, to record beside a checkpoint or in a metrics line.

        Raises:
            UnknownRunError: the run has no head row.
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        from ledger.audit.witness import Witness

        return Witness.of_head(run_id, self.head(run_id))

    def check_witnesses(self, witnesses: Iterable[Witness]) -> list[Problem]:
        """Problems of ``witnesses`` against this ledger (one snapshot): a ledger behind what
        a witness saw, or diverging from it. Empty: every witness holds. Reads only.

        Raises:
            LedgerUnavailableError: the database stayed unreachable for ``retry_seconds``.
        """
        witnesses = list(witnesses)
        return self._with_retries(self._check_witnesses_once, witnesses)

    def _check_witnesses_once(self, witnesses: list[Witness]) -> list[Problem]:
        from ledger.audit.witness import check_witnesses

        with self.snapshot() as reader:
            return check_witnesses(reader, witnesses)
