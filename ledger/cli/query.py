"""What the ``ledger`` command asks of a ledger: one function per subcommand, JSON-ready answers.

Every function here opens the database read-only (``db_upgrade`` is the one exception), reads,
and returns a plain ``dict`` that :mod:`ledger.cli.render` prints as a table or as JSON, so the two
forms cannot disagree. Every answer carries a ``header``, as etcd's responses do:

- for one run: the run's head row as read *before* the events (``run_id``, ``seq``,
  ``version``, ``epoch``, ``publisher_cell``, ``head_hash``). Reads of events stop at the
  header's ``seq``, so an answer is a consistent snapshot even while a trainer appends;
- for the whole database (``runs``, ``verify --all-runs``): ``backend``, ``schema_revision``
  and the number of runs;
- for ``db current``/``db upgrade``: the URL, backend, and the stamped and newest revisions.

Argument errors (a bad range, time, kind or version) raise :class:`QueryError`, a
:class:`~ledger.errors.LedgerError`, so the command maps every user error to one line and exit
code 2. A row the database returns but that cannot be decoded (corrupt JSON or timestamp) is
reported the same way, never as a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ledger.errors import LedgerError, LedgerUnavailableError, UnknownRunError
from ledger.events import Event, EventKind, Head
from ledger.migrate import head_revision
from ledger.projections import RunState, fold
from ledger.store import Ledger, schema_revision_at

__all__ = [
    "LogAnswer",
    "QueryError",
    "SeqRange",
    "cells",
    "database_url",
    "db_current",
    "db_upgrade",
    "lag",
    "log",
    "parse_range",
    "parse_time",
    "replay",
    "run_header",
    "runs",
    "show",
    "sqlite_path",
    "status",
    "verify",
]

DEFAULT_SQLITE_TEMPLATE = "runs/{run_id}/ledger.db"  # where `orchestrator run` puts a run's ledger


class QueryError(LedgerError):
    """A command-line argument the ledger cannot answer: bad range, time, kind, version, run."""


# ---------------------------------------------------------------------- arguments


def database_url(db: str | None, run_id: str | None = None) -> str:
    """The URL to open: ``db`` as given, a bare path as SQLite, or the run's default file.

    ``db`` without a ``:`` is a path to a SQLite file (``runs/r1/ledger.db``). With no ``db``
    at all, a named run means ``sqlite:///runs/<run-id>/ledger.db``, where ``orchestrator run``
    keeps it.
    """
    if db is None or not db.strip():
        if run_id:
            return f"sqlite:///{DEFAULT_SQLITE_TEMPLATE.format(run_id=run_id)}"
        raise QueryError("no database: pass --db URL (or set LEDGER_DB), or --run RUN")
    db = db.strip()
    if ":" not in db:
        return f"sqlite:///{db}"
    return db


@dataclass(frozen=True)
class SeqRange:
    """A parsed ``-r`` range. Endpoints are resolved against the head's ``seq`` by
    :meth:`resolve`; ``None`` is an open end."""

    text: str
    start: int | None = None  # a seq, or None: from seq 1
    end: int | None = None  # a seq, or None: to the head
    last: int | None = None  # "-N": the last N events
    start_back: int | None = None  # "head-N" as the start
    end_back: int | None = None  # "head-N" as the end

    def resolve(self, last_seq: int) -> tuple[int, int]:
        """``(first, last)`` seq, inclusive; ``first > last`` means no events."""
        if self.last is not None:
            return max(1, last_seq - self.last + 1), last_seq
        if self.start_back is not None:
            first = max(1, last_seq - self.start_back)
        else:
            first = self.start if self.start is not None else 1
        if self.end_back is not None:
            final = last_seq - self.end_back
        else:
            final = min(self.end, last_seq) if self.end is not None else last_seq
        return first, final


_ENDPOINT = re.compile(r"^(?:(?P<seq>\d+)|head(?:-(?P<back>\d+))?|-(?P<last>\d+))$")


def _endpoint(text: str, whole: str, *, is_start: bool) -> tuple[int | None, int | None]:
    """``(seq, back)`` of one endpoint: ``N`` -> (N, None), ``head[-N]`` -> (None, N), and
    (as a start only) ``-N``, the last N events -> (None, N - 1)."""
    match = _ENDPOINT.match(text)
    if match is None:
        raise QueryError(
            f"bad range {whole!r}: {text!r} is not a seq number, 'head', 'head-N' or '-N' "
            "(ranges look like 120:head, 5:9, -20, 40:)"
        )
    if match["seq"] is not None:
        seq = int(match["seq"])
        if seq < 1:
            raise QueryError(f"bad range {whole!r}: seq numbers start at 1")
        return seq, None
    if match["last"] is not None:
        count = int(match["last"])
        if not is_start:
            raise QueryError(f"bad range {whole!r}: -N (the last N) can only start a range")
        if count < 1:
            raise QueryError(f"bad range {whole!r}: -N needs N >= 1")
        return None, count - 1
    return None, int(match["back"] or 0)


def parse_range(text: str | None) -> SeqRange:
    """Parse an alembic-style ``-r`` range of seq numbers.

    Forms: ``A:B`` (inclusive), ``A:`` (to the head), ``:B`` (from seq 1), ``A`` (one event),
    ``-N`` (the last N events); ``A`` and ``B`` are seq numbers, ``head`` or ``head-N``, and
    ``A`` may also be ``-N`` (``-5:head`` is ``-5``).

    Raises:
        QueryError: anything else, or a range whose start is after its end.
    """
    if text is None or text.strip() in ("", ":"):
        return SeqRange(text or ":")
    text = text.strip()
    if re.fullmatch(r"-\d+", text):
        count = int(text[1:])
        if count < 1:
            raise QueryError(f"bad range {text!r}: -N needs N >= 1")
        return SeqRange(text, last=count)
    if ":" not in text:
        seq, back = _endpoint(text, text, is_start=False)
        return SeqRange(text, start=seq, end=seq, start_back=back, end_back=back)
    if text.count(":") > 1:
        raise QueryError(f"bad range {text!r}: use A:B")
    left, right = (part.strip() for part in text.split(":"))
    start, start_back = _endpoint(left, text, is_start=True) if left else (None, None)
    end, end_back = _endpoint(right, text, is_start=False) if right else (None, None)
    if start is not None and end is not None and start > end:
        raise QueryError(f"bad range {text!r}: start {start} is after end {end}")
    if start_back is not None and end_back is not None and start_back < end_back:
        raise QueryError(f"bad range {text!r}: start is after end")
    return SeqRange(text, start=start, end=end, start_back=start_back, end_back=end_back)


def parse_time(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time as a naive UTC datetime (how the ledger stores them); naive is UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise QueryError(
            f"{option}: {text!r} is not an ISO time (e.g. 2026-11-29T10:00:00Z)"
        ) from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def parse_kinds(kinds: list[str] | None) -> frozenset[str]:
    """Validate ``--kind`` values against :class:`~ledger.events.EventKind`."""
    known = {kind.value for kind in EventKind}
    chosen = frozenset(kinds or ())
    unknown = sorted(chosen - known)
    if unknown:
        raise QueryError(
            f"unknown event kind {unknown[0]!r} (kinds: {', '.join(sorted(known))})"
        )
    return chosen


# ---------------------------------------------------------------------- reading


def _corrupt(exc: Exception) -> LedgerError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return LedgerError(f"corrupt row in the ledger: {detail}")


@contextmanager
def _reader(url: str) -> Iterator[Ledger]:
    """The ledger at ``url``, read-only; undecodable rows surface as :class:`LedgerError`."""
    ledger = Ledger.open(url, readonly=True)
    try:
        yield ledger
    except (ValueError, TypeError) as exc:  # a row SQLAlchemy could not decode (JSON, time)
        raise _corrupt(exc) from exc
    except sa.exc.SQLAlchemyError as exc:  # pragma: no cover - the store translates its own
        raise LedgerUnavailableError(f"database error: {exc}") from exc
    finally:
        ledger.close()


def _select_run(ledger: Ledger, run_id: str | None) -> tuple[str, Head]:
    """The run asked for, else the only or newest run; with the head read now."""
    if run_id is None:
        summaries = ledger.runs()
        if not summaries:
            raise QueryError(f"{ledger.url} has no runs yet")
        run_id = summaries[-1].run_id
    try:
        return run_id, ledger.head(run_id)
    except UnknownRunError:
        known = [summary.run_id for summary in ledger.runs()]
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


def _database_header(ledger: Ledger, run_count: int) -> dict[str, Any]:
    return {
        "backend": ledger.backend,
        "schema_revision": ledger.schema_revision(),
        "runs": run_count,
    }


def _time(moment: datetime | None) -> str | None:
    # The same rendering as Event.to_dict(): ISO 8601, naive, UTC.
    return None if moment is None else moment.isoformat()


def replay(url: str, run_id: str | None) -> tuple[dict[str, Any], RunState]:
    """The run's header and its state folded from every event up to the header's seq."""
    with _reader(url) as ledger:
        run_id, head = _select_run(ledger, run_id)
        return run_header(run_id, head), fold(run_id, ledger.events(run_id, 1, head.seq))


# ---------------------------------------------------------------------- one function per command


def runs(url: str) -> dict[str, Any]:
    """Every run, oldest first, with its head; the header names the default (newest) run."""
    with _reader(url) as ledger:
        summaries = ledger.runs()
        header = _database_header(ledger, len(summaries))
    header["default_run"] = summaries[-1].run_id if summaries else None
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
            }
            for summary in summaries
        ],
    }


def status(url: str, run_id: str | None) -> dict[str, Any]:
    """The run's head row, plus where it lives (backend, URL, schema revision)."""
    with _reader(url) as ledger:
        run_id, head = _select_run(ledger, run_id)
        revision = ledger.schema_revision()
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
            "schema_head": head_revision(),
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
    with _reader(url) as ledger:
        run_id, head = _select_run(ledger, run_id)
        first, final = parsed_range.resolve(head.seq)

        def matching() -> Iterator[Event]:
            if first > final:
                return
            for event in ledger.events(run_id, first, final):
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
    with _reader(url) as ledger:
        run_id, head = _select_run(ledger, run_id)
        event: Event | None
        if seq is not None:
            if not 1 <= seq <= head.seq:
                raise QueryError(f"run {run_id!r} has no seq {seq} (last seq is {head.seq})")
            event = next(iter(ledger.events(run_id, seq, seq)), None)
            missing = f"run {run_id!r} has no event at seq {seq}"
        else:
            assert version is not None
            if not 0 <= version <= head.version:
                raise QueryError(
                    f"run {run_id!r} has no version {version} (head version is {head.version})"
                )
            if version == 0:  # the initial weights: the run_started event
                event = next(iter(ledger.events(run_id, 1, 1)), None)
            else:
                event = ledger.event_at_version(run_id, version)
            missing = f"run {run_id!r} has no weight_committed event for version {version}"
        if event is None:
            raise QueryError(f"{missing} (run `ledger verify`)")
        return {"header": run_header(run_id, head), "event": event.to_dict()}


def verify(url: str, run_id: str | None, all_runs: bool = False) -> dict[str, Any]:
    """Audit one run (or every run): problems break section-4 invariants, notes do not."""
    if all_runs and run_id is not None:
        raise QueryError("verify: give --run RUN or --all-runs, not both")
    with _reader(url) as ledger:
        if all_runs:
            report = ledger.verify(None)
            header = _database_header(ledger, len(report.run_ids))
        else:
            run_id, head = _select_run(ledger, run_id)
            report = ledger.verify(run_id)
            header = run_header(run_id, head)
    return {
        "header": header,
        "ok": report.ok,
        "runs": list(report.run_ids),
        "events_checked": report.events_checked,
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
    """Per cell: state, epochs held, promotions, last event (from a replay of the run)."""
    header, state = replay(url, run_id)
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
            }
            for cell in sorted(state.cells.values(), key=lambda view: view.cell_id)
        ],
    }


def lag(url: str, run_id: str | None) -> dict[str, Any]:
    """Per engine: the newest version it was stamped with, the head, and the lag between."""
    header, state = replay(url, run_id)
    head_version = header["version"]
    return {
        "header": header,
        "engines": [
            {
                "engine_id": engine.engine_id,
                "stamped_version": engine.stamped_version,
                "head_version": head_version,
                "lag": head_version - engine.stamped_version,
                "last_seq": engine.last_seq,
            }
            for engine in sorted(state.engines.values(), key=lambda view: view.engine_id)
        ],
        "unstamped_versions": state.unstamped_versions,
    }


def _revision_state(current: str | None, newest: str) -> str:
    if current is None:
        return "missing"
    return "current" if current == newest else "not current"


def db_current(url: str) -> dict[str, Any]:
    """The schema revision stamped in the database, next to the newest this code knows."""
    current = schema_revision_at(url)
    newest = head_revision()
    parsed = sa.make_url(url)
    return {
        "header": {
            "url": parsed.render_as_string(hide_password=True),
            "backend": parsed.get_backend_name(),
            "schema_revision": current,
            "schema_head": newest,
        },
        "revision": current,
        "head": newest,
        "state": _revision_state(current, newest),
    }


def db_upgrade(url: str) -> dict[str, Any]:
    """Create the database or upgrade its schema to the newest revision (the one writer here)."""
    try:
        before = schema_revision_at(url)
    except LedgerUnavailableError:
        raise
    except LedgerError:
        before = None  # no file yet: the writer below creates it (or re-raises a bad URL)
    with Ledger.open(url) as ledger:
        after = ledger.schema_revision()
        return {
            "header": {
                "url": ledger.url,
                "backend": ledger.backend,
                "schema_revision": after,
                "schema_head": head_revision(),
            },
            "from": before,
            "to": after,
            "changed": before != after,
        }


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, else None."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)
