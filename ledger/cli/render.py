"""Print the answers of :mod:`ledger.cli.query` as tables, stable one-line records, JSON or CSV.

Formats:

- ``table``: tables without borders (kubectl style: upper-case headers, aligned columns), or
  ``key  value`` lines for one object (:mod:`ledger.cli.table_layout`). No colour and no
  markup, so a cell id such as ``[x]`` prints as itself. Width: ``COLUMNS`` if set, else the
  terminal's, else 160 when the output is not a terminal (so a pipe gets long lines rather
  than wrapped ones).
- log lines (``log -o table``): one event per line, ``SEQ HASH12 TIME KIND key=value...``,
  envelope fields (``version``, ``cell``, ``epoch``) first, then payload keys sorted; a value
  that is not a plain word is JSON-quoted, so every line splits on spaces the same way.
- ``json``: the answer dict, indented, header first.
- ``jsonl``: ``Event.to_dict()`` per line, nothing else (lossless: it holds every stored
  field); the header is in ``-o json``.
- ``csv``: every stored field as a column, payload as canonical JSON.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TextIO

from ledger.cli.table_layout import Table, print_table
from ledger.events import Event, canonical_json

__all__ = [
    "EVENT_FIELDS",
    "event_line",
    "print_cells",
    "print_db_current",
    "print_db_upgrade",
    "print_events",
    "print_json",
    "print_lag",
    "print_plot",
    "print_runs",
    "print_show",
    "print_status",
    "print_verify",
]

EVENT_FIELDS = (
    "run_id", "seq", "kind", "version", "cell_id", "epoch", "idempotency_key", "payload",
    "recorded_at", "prev_hash", "hash",
)
SHORT_HASH = 12
_PIPE_WIDTH = 160
_PLAIN_WORD = re.compile(r"^[\w.:/@+\-]+$")


# ---------------------------------------------------------------------- primitives


def _width(out: TextIO) -> int:
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if hasattr(out, "isatty") and out.isatty():
        return shutil.get_terminal_size().columns
    return _PIPE_WIDTH


def _print_table(out: TextIO, table: Table) -> None:
    print_table(out, table, _width(out))


def _table(*headers: str) -> Table:
    return Table(*headers)


def _pairs(out: TextIO, rows: Iterable[tuple[str, Any]]) -> None:
    table = Table("key", "value", show_header=False, no_wrap_first=True)
    for key, value in rows:
        table.add_row(key, _text(value))
    _print_table(out, table)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _node(row: dict[str, Any]) -> str:
    """A node as ``host/abcdef12`` (host and the start of the Ray node id), or ``-``."""
    if not row.get("node_id"):
        return "-"
    return f"{row.get('host') or '?'}/{row['node_id'][:8]}"


def _when(iso: str | None) -> str:
    """A stored (naive UTC) ISO time as ``2026-11-29T10:00:00.123Z``."""
    if iso is None:
        return "-"
    return datetime.fromisoformat(iso).isoformat(timespec="milliseconds") + "Z"


def _short(digest: str | None) -> str:
    return "-" if digest is None else digest[:SHORT_HASH]


def print_json(answer: dict[str, Any], out: TextIO) -> None:
    """The answer as indented JSON (header first, as built)."""
    out.write(json.dumps(answer, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------- events


def _field(value: Any) -> str:
    if isinstance(value, str) and _PLAIN_WORD.match(value):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_line(event: Event) -> str:
    """One stable line per event, like ``git log --oneline``."""
    parts = [
        str(event.seq),
        event.hash[:SHORT_HASH],
        event.recorded_at.isoformat(timespec="milliseconds") + "Z",
        event.kind,
    ]
    if event.version is not None:
        parts.append(f"version={event.version}")
    if event.cell_id is not None:
        parts.append(f"cell={_field(event.cell_id)}")
    if event.epoch is not None:
        parts.append(f"epoch={event.epoch}")
    for key in sorted(event.payload):
        value = event.payload[key]
        if value is not None:
            parts.append(f"{key}={_field(value)}")
    return " ".join(parts)


def print_events(
    header: dict[str, Any],
    events: Iterable[Event],
    output: str,
    out: TextIO,
    *,
    seq_range: tuple[int, int] | None = None,
) -> int:
    """Print a stream of events as ``table`` (lines), ``json``, ``jsonl`` or ``csv``.

    Returns how many events were printed.
    """
    count = 0
    if output == "json":
        listed = [event.to_dict() for event in events]
        answer: dict[str, Any] = {"header": header}
        if seq_range is not None:
            answer["range"] = {"first_seq": seq_range[0], "last_seq": seq_range[1]}
        answer["events"] = listed
        print_json(answer, out)
        return len(listed)
    if output == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(EVENT_FIELDS)
        for event in events:
            row = event.to_dict()
            row["payload"] = canonical_json(row["payload"])
            writer.writerow(["" if row[name] is None else row[name] for name in EVENT_FIELDS])
            count += 1
        return count
    for event in events:
        if output == "jsonl":
            out.write(json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False))
        else:
            out.write(event_line(event))
        out.write("\n")
        count += 1
    return count


def print_show(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """One event whole: envelope fields, then the payload as indented JSON."""
    if output == "json":
        print_json(answer, out)
        return
    event = answer["event"]
    rows = [
        ("run", event["run_id"]),
        ("seq", event["seq"]),
        ("kind", event["kind"]),
        ("version", event["version"]),
        ("cell", event["cell_id"]),
        ("epoch", event["epoch"]),
        ("idempotency key", event["idempotency_key"]),
        ("recorded at", _when(event["recorded_at"])),
        ("prev hash", event["prev_hash"]),
        ("hash", event["hash"]),
        ("payload", json.dumps(event["payload"], indent=2, sort_keys=True, ensure_ascii=False)),
    ]
    if "lineage" in answer:  # `show VERSION`: the `ledger lineage VERSION` summary line
        rows.insert(4, ("lineage", answer["lineage"]))
    _pairs(out, rows)


# ---------------------------------------------------------------------- run and database views


def print_runs(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    table = _table("RUN", "CREATED", "VERSION", "EVENTS", "PUBLISHER", "EPOCH", "STATE")
    for run in answer["runs"]:
        state = run["state"] if not run["problems"] else f"{run['state']}: " + ", ".join(
            run["problems"]
        )
        table.add_row(
            run["run_id"], _when(run["created_at"]), _text(run["version"]),
            _text(run["events"]), _text(run["publisher_cell"]), _text(run["epoch"]), state,
        )
    _print_table(out, table)
    if not answer["runs"]:
        out.write("no runs\n")


def print_status(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    revision = answer["schema_revision"]
    newest = answer["schema_head"]
    marker = " (head)" if revision == newest else f" (head is {newest})"
    _pairs(
        out,
        [
            ("run", answer["run_id"]),
            ("version", answer["version"]),
            ("epoch", answer["epoch"]),
            ("publisher cell", answer["publisher_cell"]),
            ("last seq", answer["last_seq"]),
            ("head hash", _short(answer["head_hash"])),
            ("backend", answer["backend"]),
            ("database", answer["url"]),
            ("schema revision", f"{revision}{marker}"),
        ],
    )


def print_verify(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """Problems one per line (``run R seq N: check: message``), notes, then a verdict line."""
    if output == "json":
        print_json(answer, out)
        return
    for problem in answer["problems"]:
        out.write(
            f"run {problem['run_id']} seq {problem['seq']}: {problem['check']}: "
            f"{problem['message']}\n"
        )
    for note in answer["notes"]:
        from ledger.audit.report import compact_ranges  # the audit package: verify only

        versions = compact_ranges(note["versions"])
        plural = "s" if len(note["versions"]) > 1 else ""
        out.write(
            f"note: run {note['run_id']}: version{plural} {versions} committed but not "
            "stamped on any engine (a publisher died between commit and stamp)\n"
        )
    runs = len(answer["runs"])
    scope = f"{runs} run{'s' if runs != 1 else ''}, {answer['events_checked']} events"
    if answer.get("witnesses_checked"):
        scope += f", {answer['witnesses_checked']} witnesses"
    scope += " checked"
    if answer["ok"]:
        out.write(f"ok: {scope}, no problems\n")
    else:
        count = len(answer["problems"])
        out.write(f"FAILED: {count} problem{'s' if count != 1 else ''} ({scope})\n")


def print_cells(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    table = _table("CELL", "STATE", "EPOCHS", "PROMOTIONS", "LAST SEQ", "LAST EVENT", "LAST AT",
                   "NODE")
    for cell in answer["cells"]:
        table.add_row(
            cell["cell_id"], cell["state"],
            ",".join(str(epoch) for epoch in cell["epochs"]) or "-",
            _text(cell["promotions"]), _text(cell["last_seq"]), cell["last_kind"] or "-",
            _when(cell["last_recorded_at"]), _node(cell),
        )
    _print_table(out, table)
    if not answer["cells"]:
        out.write("no cells yet\n")


def print_lag(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    table = _table("ENGINE", "STAMPED", "HEAD", "LAG", "LAST SEQ", "NODE")
    for engine in answer["engines"]:
        table.add_row(
            engine["engine_id"], _text(engine["stamped_version"]),
            _text(engine["head_version"]), _text(engine["lag"]), _text(engine["last_seq"]),
            _node(engine),
        )
    _print_table(out, table)
    if not answer["engines"]:
        out.write("no engines stamped yet\n")
    if answer["unstamped_versions"]:
        from ledger.audit.report import compact_ranges  # the audit package: lag only

        versions = compact_ranges(answer["unstamped_versions"])
        out.write(f"note: committed but never stamped: {versions}\n")


def print_db_current(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """Like ``alembic current``: the stamped revision, marked ``(head)`` when current."""
    if output == "json":
        print_json(answer, out)
        return
    revision, newest = answer["revision"], answer["head"]
    if revision is None:
        out.write(f"none (no ledger schema; `ledger db upgrade` creates revision {newest})\n")
    elif revision == newest:
        out.write(f"{revision} (head)\n")
    else:
        out.write(f"{revision} (head is {newest}; run `ledger db upgrade`)\n")


def print_db_upgrade(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    url = answer["header"]["url"]
    if answer["changed"]:
        out.write(f"upgraded {url}: {answer['from'] or 'none'} -> {answer['to']} (head)\n")
    else:
        out.write(f"{url} is already at {answer['to']} (head)\n")


def print_plot(answer: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print_json(answer, out)
        return
    metrics = answer["metrics"]
    histogram = (
        f"staleness histogram from {metrics}" if answer["histogram"] is not None
        else "no staleness histogram (no metrics file)" if metrics is None
        else f"no staleness histogram in {metrics}"
    )
    counts = ", ".join(
        _count(answer[key], noun)
        for key, noun in (
            ("commits", "commit"), ("promotions", "promotion"), ("aborted", "aborted update"),
        )
    )
    out.write(f"wrote {answer['file']}: {counts}; {histogram}\n")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
