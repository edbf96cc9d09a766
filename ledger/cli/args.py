"""The ``ledger`` command's arguments: the database to open, seq ranges, times, event kinds.

Every bad argument raises :class:`QueryError`, a :class:`~ledger.errors.LedgerError`, so the
command maps it to one line on stderr and exit code 2.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ledger.errors import QueryError
from ledger.events import EventKind
from ledger.redact import url_without_password
from ledger.run_layout import (
    CHECKPOINT_DIR,
    DEFAULT_RUNS_DIR,
    LEDGER_DB_ENV,
    LEDGER_FILE,
    default_ledger_url,
)

__all__ = [
    "QueryError",
    "SeqRange",
    "audit_command",
    "database_url",
    "ledger_beside",
    "parse_kinds",
    "parse_range",
    "parse_time",
]


def database_url(db: str | None, run_id: str | None = None) -> str:
    """The URL to open: ``db`` as given, a bare path as SQLite, or the run's default file.

    ``db`` without a ``:`` is a path to a SQLite file (``runs/r1/ledger.db``). With no ``db``
    at all, a named run means ``sqlite:///runs/<run-id>/ledger.db``, where ``orchestrator run``
    keeps it.
    """
    if db is None or not db.strip():
        if run_id:
            return default_ledger_url(DEFAULT_RUNS_DIR / run_id)
        raise QueryError("no database: pass --db URL (or set LEDGER_DB), or --run RUN")
    db = db.strip()
    if ":" not in db:
        return f"sqlite:///{db}"
    return db


def ledger_beside(path: str) -> str | None:
    """The embedded ledger of the run directory that ``path`` is, or is in (a checkpoint,
    the checkpoints directory, a metrics or witness file), if it has one."""
    start = Path(path)
    folder = start if start.is_dir() else start.parent
    candidates = [folder]
    if folder.name == CHECKPOINT_DIR:
        candidates.append(folder.parent)
    for candidate in candidates:
        if (candidate / LEDGER_FILE).is_file():
            return default_ledger_url(candidate)
    return None


def audit_command(url: str, run_id: str, run_dir: Path | str) -> str:
    """The ``ledger verify`` command line that audits ``run_id`` and checks its run directory's
    witnesses, safe to print and ready to run: the run directory's own SQLite ledger is found
    by ``--witness``; any other database is named through ``LEDGER_DB`` without its password
    (libpq then reads ``PGPASSWORD`` or ``~/.pgpass``).
    """
    witness = shlex.quote(str(run_dir))
    if ledger_beside(str(run_dir)) == url:
        return f"ledger verify --witness {witness}"
    return (
        f"{LEDGER_DB_ENV}={shlex.quote(url_without_password(url))} ledger verify "
        f"--run {shlex.quote(run_id)} --witness {witness}"
    )


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
