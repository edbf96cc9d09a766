"""What the ``ledger`` command asks of a ledger: one function per subcommand, JSON-ready answers.

Every function here opens the database read-only (``db_upgrade`` is the one exception), reads
through one snapshot (one read transaction, ``REPEATABLE READ`` on PostgreSQL), and returns a
plain ``dict`` that :mod:`ledger.cli.render` prints as a table or as JSON, so the two forms
cannot disagree. Every answer carries a ``header``, as etcd's responses do:

- for one run: the run's head row (``run_id``, ``seq``, ``version``, ``epoch``,
  ``publisher_cell``, ``head_hash``). Reads of events stop at the header's ``seq`` and come
  from the same snapshot, so an answer is consistent even while a trainer appends;
- for the whole database (``runs``, ``verify``): ``backend``, ``schema_revision`` and the
  number of runs;
- for ``db current``/``db upgrade`` (:mod:`ledger.cli.db`): the URL, backend, and the
  stamped and newest revisions.

Argument errors (:mod:`ledger.cli.args`) raise :class:`QueryError`, a
:class:`~ledger.errors.LedgerError`, so the command maps every user error to one line and exit
code 2. A row the database returns but that cannot be decoded (corrupt JSON or timestamp) is
reported the same way, never as a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.cli.args import QueryError, database_url, parse_kinds, parse_range, parse_time
from ledger.cli.session import Source, run_header, select_run, snapshot
from ledger.errors import UnknownRunError
from ledger.events import Event, EventKind
from ledger.progress import load_engine_stamps
from ledger.store.codecs import SCHEMA_HEAD
from ledger.store.reads import Reader

if TYPE_CHECKING:  # the read model (and the payload models it reads through) is loaded by
    from ledger.projections import RunState  # the commands that fold, not by `status`

__all__ = [
    "LogAnswer",
    "QueryError",
    "cells",
    "database_url",
    "lag",
    "log",
    "replay",
    "run_header",
    "runs",
    "show",
    "sqlite_path",
    "status",
    "verify",
]


# ---------------------------------------------------------------------- reading


def _database_header(ledger: Source, reader: Reader, run_count: int) -> dict[str, Any]:
    return {
        "backend": ledger.backend,
        "schema_revision": reader.schema_revision(),
        "runs": run_count,
    }


def _time(moment: datetime | None) -> str | None:
    # The same rendering as Event.to_dict(): ISO 8601, naive, UTC.
    return None if moment is None else moment.isoformat()


def replay(url: str, run_id: str | None) -> tuple[dict[str, Any], RunState]:
    """The run's header and its state (the read model) folded from every event up to it."""
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        from ledger.projections import fold

        return run_header(run_id, head), fold(run_id, reader.events(run_id, 1, head.seq))


@dataclass
class _Nodes:
    """The node each cell and engine was last recorded on (``node_id``, ``host`` in the
    payloads of ``cell_state``, ``cell_promoted`` and ``engines_stamped``; a run from before
    placement was recorded has none)."""

    cells: dict[str, dict[str, str]]
    engines: dict[str, dict[str, str]]

    @classmethod
    def of(cls, events: list[Event]) -> _Nodes:
        cells: dict[str, dict[str, str]] = {}
        engines: dict[str, dict[str, str]] = {}
        for event in events:
            payload = event.payload
            if event.kind in (EventKind.CELL_STATE, EventKind.CELL_PROMOTED) and event.cell_id:
                if "node_id" in payload:
                    cells[event.cell_id] = _node(payload)
            elif event.kind == EventKind.ENGINES_STAMPED:
                for engine_id, node in (payload.get("engine_nodes") or {}).items():
                    engines[engine_id] = _node(node)
        return cls(cells, engines)


def _node(fields: dict[str, Any]) -> dict[str, str]:
    return {"node_id": fields.get("node_id"), "host": fields.get("host")}


_NO_NODE = {"node_id": None, "host": None}


def _replay_with_nodes(url: str, run_id: str | None
                       ) -> tuple[dict[str, Any], RunState, _Nodes]:
    """:func:`replay`, plus where each cell and engine was last recorded (one snapshot)."""
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        events = list(reader.events(run_id, 1, head.seq))
    from ledger.projections import fold

    return run_header(run_id, head), fold(run_id, events), _Nodes.of(events)


# ---------------------------------------------------------------------- one function per command


def runs(url: str) -> dict[str, Any]:
    """Every run, oldest first, with its head; damaged runs too, marked ``broken`` with what
    they lack. The header names the default (newest) run."""
    with snapshot(url) as (ledger, reader):
        summaries = reader.runs()
        header = _database_header(ledger, reader, len(summaries))
        header["default_run"] = reader.newest_run_id()
    return {
        "header": header,
        "runs": [
            {
                "run_id": summary.run_id,
                "created_at": _time(summary.created_at),
                "version": summary.head_version,
                "events": summary.last_seq,
                "publisher_cell": summary.publisher_cell,
                "epoch": summary.epoch,
                "state": "broken" if summary.broken else "ok",
                "problems": list(summary.problems),
            }
            for summary in summaries
        ],
    }


def status(url: str, run_id: str | None) -> dict[str, Any]:
    """The run's head row, plus where it lives (backend, URL, schema revision)."""
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        revision = reader.schema_revision()
        return {
            "header": run_header(run_id, head),
            "run_id": run_id,
            "version": head.version,
            "epoch": head.epoch,
            "publisher_cell": head.publisher_cell,
            "last_seq": head.seq,
            "head_hash": head.hash,
            "backend": ledger.backend,
            "url": ledger.url,
            "schema_revision": revision,
            "schema_head": SCHEMA_HEAD,
        }


@dataclass
class LogAnswer:
    """A header and a stream of events (read lazily, so a long log is never held in memory)."""

    header: dict[str, Any]
    first_seq: int
    last_seq: int
    events: Iterator[Event]


@contextmanager
def log(
    url: str,
    run_id: str | None,
    seq_range: str | None = None,
    *,
    kinds: list[str] | None = None,
    cells: list[str] | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Iterator[LogAnswer]:
    """Events of the run in seq order, within ``seq_range`` and matching every filter.

    Use as a context manager: the ledger stays open while the events stream. The range is
    resolved against the head first (so ``-20`` is "the last 20 events"), then ``kinds``,
    ``cells`` and ``since <= recorded_at <= until`` filter inside it.
    """
    parsed_range = parse_range(seq_range)
    wanted_kinds = parse_kinds(kinds)
    wanted_cells = frozenset(cells or ())
    after = parse_time(since, "--since")
    before = parse_time(until, "--until")
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        first, final = parsed_range.resolve(head.seq)

        def matching() -> Iterator[Event]:
            if first > final:
                return
            for event in reader.events(run_id, first, final):
                if wanted_kinds and event.kind not in wanted_kinds:
                    continue
                if wanted_cells and event.cell_id not in wanted_cells:
                    continue
                if after is not None and event.recorded_at < after:
                    continue
                if before is not None and event.recorded_at > before:
                    continue
                yield event

        yield LogAnswer(run_header(run_id, head), first, final, matching())


def show(
    url: str, run_id: str | None, version: int | None = None, seq: int | None = None
) -> dict[str, Any]:
    """One event whole: the commit of ``version`` (0: ``run_started``), or the event at ``seq``."""
    if version is None and seq is None:
        raise QueryError("show needs a VERSION or --seq N")
    if version is not None and seq is not None:
        raise QueryError("show takes a VERSION or --seq N, not both")
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        event: Event | None
        if seq is not None:
            if not 1 <= seq <= head.seq:
                raise QueryError(f"run {run_id!r} has no seq {seq} (last seq is {head.seq})")
            event = next(iter(reader.events(run_id, seq, seq)), None)
            missing = f"run {run_id!r} has no event at seq {seq}"
        else:
            assert version is not None
            if not 0 <= version <= head.version:
                raise QueryError(
                    f"run {run_id!r} has no version {version} (head version is {head.version})"
                )
            if version == 0:  # the initial weights: the run_started event
                event = next(iter(reader.events(run_id, 1, 1)), None)
            else:
                event = reader.event_at_version(run_id, version)
            missing = f"run {run_id!r} has no weight_committed event for version {version}"
        if event is None:
            raise QueryError(f"{missing} (run `ledger verify`)")
        answer = {"header": run_header(run_id, head), "event": event.to_dict()}
        if version is not None:  # one line: who produced it, who trained on it, who served it
            from ledger.cli.lineage_query import version_lineage

            answer["lineage"] = version_lineage(reader, run_id, head, version)["summary"]
        return answer


def verify(url: str, run_id: str | None, witnesses: list[str] | None = None,
           since_verified: bool = False) -> dict[str, Any]:
    """Audit every run (or only ``run_id``) in one snapshot, and check the witnesses found at
    each of ``witnesses`` (run directories, checkpoints, witness or metrics files): problems
    break invariants, notes do not. With ``since_verified`` each run is checked from its
    newest audit checkpoint whose hash is still the chain's (``verified_from`` says where).

    Raises:
        QueryError: an unknown run.
        LedgerError: a witness path with no witness, or a malformed one.
    """
    from ledger import audit
    from ledger.audit.witness import read_witnesses

    found = [witness for path in witnesses or () for witness in read_witnesses(path)]
    with snapshot(url) as (ledger, reader):
        try:
            report = audit.verify(reader, run_id, found, since_verified=since_verified)
        except UnknownRunError:
            select_run(ledger, reader, run_id)  # raises the listing error
            raise
        header = _database_header(ledger, reader, len(report.run_ids))
    return {
        "header": header,
        "ok": report.ok,
        "runs": list(report.run_ids),
        "events_checked": report.events_checked,
        **({"verified_from": report.verified_from} if since_verified else {}),
        "witnesses_checked": report.witnesses_checked,
        "problems": [
            {
                "run_id": problem.run_id,
                "seq": problem.seq,
                "check": problem.check,
                "message": problem.message,
            }
            for problem in report.problems
        ],
        "notes": [
            {"run_id": rid, "check": "unstamped", "versions": versions}
            for rid, versions in report.unstamped.items()
        ],
    }


def cells(url: str, run_id: str | None) -> dict[str, Any]:
    """Per cell: state, epochs held, promotions, last event, and the node it was last recorded
    on (from a replay of the run)."""
    header, state, nodes = _replay_with_nodes(url, run_id)
    return {
        "header": header,
        "cells": [
            {
                "cell_id": cell.cell_id,
                "state": cell.state,
                "publisher": cell.cell_id == state.publisher_cell,
                "epochs": list(cell.epochs),
                "promotions": cell.promotions,
                "last_seq": cell.last_seq,
                "last_kind": cell.last_kind,
                "last_recorded_at": _time(cell.last_recorded_at),
                **nodes.cells.get(cell.cell_id, _NO_NODE),
            }
            for cell in sorted(state.cells.values(), key=lambda view: view.cell_id)
        ],
    }


def lag(url: str, run_id: str | None) -> dict[str, Any]:
    """Per engine: the newest version it was stamped with, the head, the lag between, and the
    node it was last stamped on (from the run's newest trusted snapshot plus the commits and
    stamps after it)."""
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        stamps = load_engine_stamps(reader, run_id, head.seq)
    header = run_header(run_id, head)
    return {
        "header": header,
        "engines": [
            {
                "engine_id": engine_id,
                "stamped_version": stamped,
                "head_version": head.version,
                "lag": head.version - stamped,
                "last_seq": last_seq,
                "node_id": node_id,
                "host": host,
            }
            for engine_id, (stamped, last_seq, node_id, host) in sorted(stamps.engines.items())
        ],
        "unstamped_versions": stamps.unstamped_versions,
    }


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, else None."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)
