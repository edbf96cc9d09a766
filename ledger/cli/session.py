"""One CLI answer's session: the ledger opened read-only, one snapshot of it, and the run the
answer is about (with the head row the answer's header shows).

A ledger is read through its driver alone (:mod:`ledger.store.plain`: ``sqlite3``, or
psycopg), so a command's start-up does not import SQLAlchemy; the reader and its SQL are the
store's. Anything else (a URL not written as the store prints it, a file that is missing or of
another schema, a server that does not answer) opens :class:`~ledger.store.Ledger`, whose
errors the user sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from ledger.cli.args import QueryError
from ledger.errors import UnknownRunError
from ledger.events import Head
from ledger.store.plain import open_plain_snapshot
from ledger.store.reads import Reader

__all__ = ["Source", "run_header", "select_run", "snapshot"]


class Source(Protocol):
    """Where an answer was read: a :class:`~ledger.store.Ledger` or a plain SQLite source."""

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""

    @property
    def url(self) -> str:
        """The database URL, safe to print."""


@contextmanager
def snapshot(url: str) -> Iterator[tuple[Source, Reader]]:
    """The ledger at ``url``, read-only, and one snapshot of it for the whole answer."""
    plain = open_plain_snapshot(url)
    if plain is not None:
        with plain as (source, reader):
            yield source, reader
        return
    from ledger.store import Ledger

    with Ledger.open(url, readonly=True) as ledger, ledger.snapshot() as reader:
        yield ledger, reader


def select_run(ledger: Source, reader: Reader, run_id: str | None) -> tuple[str, Head]:
    """The run asked for, else the only or newest run; with its head row.

    Raises:
        QueryError: no runs; an unknown run; a run without a head row (damaged).
    """
    if run_id is None:
        run_id = reader.newest_run_id()
        if run_id is None:
            raise QueryError(f"{ledger.url} has no runs yet")
    try:
        return run_id, reader.head(run_id)
    except UnknownRunError:
        if reader.run_record(run_id) is not None:
            raise QueryError(
                f"run {run_id!r} is broken: it has no head row (see `ledger verify --run "
                f"{run_id}`)"
            ) from None
        known = [summary.run_id for summary in reader.runs()]
        listed = ", ".join(known[-5:]) if known else "none"
        raise QueryError(f"unknown run {run_id!r} (runs: {listed})") from None


def run_header(run_id: str, head: Head) -> dict[str, Any]:
    """The etcd-style header of a one-run answer: the head row it was read at."""
    return {
        "run_id": run_id,
        "seq": head.seq,
        "version": head.version,
        "epoch": head.epoch,
        "publisher_cell": head.publisher_cell,
        "head_hash": head.hash,
    }
