"""Witnesses against rollback: what a run's files saw of the ledger, checked against the ledger.

A consistent rollback (a database restored from a backup older than the run, head row and all)
passes every internal check: only something outside the database can tell. So each checkpoint
and each metrics line records the ledger head it saw, a :class:`Witness` ``(run_id, seq,
version, hash)``. The ledger must still hold that event: its head at or past ``seq``, and the
event at ``seq`` with that ``hash`` (the hash chains everything before it, versions included).
A ledger behind a witness would hand out again versions that engines, checkpoints and metrics
have already seen; one that diverges has been rewritten.

Where witnesses live is :mod:`ledger.run_layout`'s: ``"ledger_head"`` in ``metrics.jsonl``
lines, ``checkpoints/step-NNNNNN.witness.json`` beside each checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ledger.store.atomic_files import write_text_atomically
from ledger.errors import LedgerError, UnknownRunError
from ledger.events import Event, EventKind, Head
from ledger.audit.report import Problem
from ledger.run_layout import (
    CHECKPOINT_DIR,
    LEDGER_HEAD_KEY,
    METRICS_FILE,
    WITNESS_KEYS,
    WITNESS_SUFFIX,
    checkpoint_witness_path,
)

__all__ = [
    "BEHIND",
    "DIVERGED",
    "Witness",
    "WitnessReader",
    "check_witness",
    "check_witnesses",
    "compare",
    "describe_missing_run",
    "read_checkpoint_witness",
    "read_witnesses",
    "write_checkpoint_witness",
]

BEHIND = "ledger_behind_witness"
DIVERGED = "witness_diverged"


@dataclass(frozen=True)
class Witness:
    """The ledger head a run's file saw: run, seq, version and hash of the head event.

    ``source`` says where it was read (``metrics.jsonl:12``); it is not part of the record.
    """

    run_id: str
    seq: int
    version: int
    hash: str
    source: str = ""

    @classmethod
    def of_head(cls, run_id: str, head: Head) -> Witness:
        """The witness of ``head`` (as ``Ledger.head(run_id)`` returned it)."""
        return cls(run_id, head.seq, head.version, head.hash)

    def to_dict(self) -> dict[str, Any]:
        """The record as written: exactly :data:`~ledger.run_layout.WITNESS_KEYS`."""
        return {"run_id": self.run_id, "seq": self.seq, "version": self.version,
                "hash": self.hash}

    @classmethod
    def from_dict(cls, record: Any, source: str) -> Witness:
        """Parse a record written by :meth:`to_dict`.

        Raises:
            LedgerError: not an object with the four keys and their types (names ``source``).
        """
        if not isinstance(record, dict) or set(WITNESS_KEYS) - record.keys():
            raise LedgerError(f"{source}: a witness needs the keys {', '.join(WITNESS_KEYS)}")
        run_id, seq, version, digest = (record[key] for key in WITNESS_KEYS)
        if not (
            isinstance(run_id, str) and run_id and isinstance(digest, str)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for n in (seq, version))
        ):
            raise LedgerError(f"{source}: malformed witness {record!r}")
        return cls(run_id, seq, version, digest, source)

    def describe(self) -> str:
        where = f"{self.source} " if self.source else ""
        return f"{where}saw seq {self.seq} (version {self.version}, hash {self.hash[:12]})"


class WitnessReader(Protocol):
    """What checking a witness reads: ``Ledger`` and a snapshot (``Ledger.snapshot()``) both."""

    def head(self, run_id: str) -> Head:
        """The run's head row; raises UnknownRunError if it has none."""

    def events(
        self, run_id: str, start_seq: int = 1, end_seq: int | None = None
    ) -> Iterable[Event]:
        """The run's events in seq order."""


# ---------------------------------------------------------------------- checking


def compare(witness: Witness, event: Event | None, version_at_seq: int | None) -> Problem | None:
    """The problem with ``witness`` given the ledger's event at its seq (None: the ledger has
    no event there) and, if known, the head version right after that event."""
    if event is None:
        return Problem(
            witness.run_id, witness.seq, BEHIND,
            f"{witness.describe()}, but the ledger has no event at that seq: it is older than "
            "what the run wrote (restored from a backup?); resuming would reuse versions",
        )
    if event.hash != witness.hash or (
        version_at_seq is not None and version_at_seq != witness.version
    ):
        version = f"version {version_at_seq}, " if version_at_seq is not None else ""
        return Problem(
            witness.run_id, witness.seq, DIVERGED,
            f"{witness.describe()}; the ledger has {version}hash {event.hash[:12]} there: "
            "its history was rewritten or restored from another copy",
        )
    return None


def describe_missing_run(witness: Witness) -> str:
    """The message of a witness whose run the ledger does not know at all."""
    return (
        f"{witness.describe()}, but the ledger has no run {witness.run_id} (restored from a "
        "backup older than the run, or damaged)"
    )


def check_witness(reader: WitnessReader, witness: Witness) -> list[Problem]:
    """Problems of ``witness`` against the ledger as ``reader`` sees it now (empty: it holds).

    Reads only. A run the ledger does not know is a ledger behind the witness.

    Raises:
        LedgerUnavailableError: the database could not be reached.
    """
    try:
        head = reader.head(witness.run_id)
    except UnknownRunError:
        return [Problem(witness.run_id, witness.seq, BEHIND, describe_missing_run(witness))]
    if witness.seq > head.seq or witness.version > head.version:
        return [Problem(
            witness.run_id, witness.seq, BEHIND,
            f"{witness.describe()}, but the ledger head is seq {head.seq} (version "
            f"{head.version}): it is older than what the run wrote (restored from a backup?); "
            "resuming would reuse versions",
        )]
    event = next(iter(reader.events(witness.run_id, witness.seq, witness.seq)), None)
    version = event.version if event is not None and event.kind == EventKind.WEIGHT_COMMITTED \
        else None
    problem = compare(witness, event, version)
    return [] if problem is None else [problem]


def check_witnesses(reader: WitnessReader, witnesses: Iterable[Witness]) -> list[Problem]:
    """:func:`check_witness` for each witness (use a snapshot reader for one consistent view)."""
    return [problem for witness in witnesses for problem in check_witness(reader, witness)]


# ---------------------------------------------------------------------- files


def write_checkpoint_witness(checkpoint: Path | str, witness: Witness) -> Path:
    """Write ``witness`` beside ``checkpoint`` (``step-N.pt`` -> ``step-N.witness.json``),
    atomically and durably (:func:`ledger.store.atomic_files.write_text_atomically`: fsync of the
    file and of its directory), and return its path.

    Raises:
        OSError: the file could not be written.
    """
    target = checkpoint_witness_path(Path(checkpoint))
    return write_text_atomically(target, json.dumps(witness.to_dict(), sort_keys=True) + "\n")


def read_checkpoint_witness(checkpoint: Path | str) -> Witness | None:
    """The witness beside ``checkpoint``, or None if it has none (a checkpoint from before
    witnesses were written).

    Raises:
        LedgerError: the sidecar exists but is not a witness.
    """
    sidecar = checkpoint_witness_path(Path(checkpoint))
    if not sidecar.is_file():
        return None
    return _read_sidecar(sidecar)


def _read_sidecar(path: Path) -> Witness:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LedgerError(f"{path}: not a witness file: {exc}") from None
    return Witness.from_dict(record, str(path))


def _metrics_witnesses(path: Path) -> Iterator[Witness]:
    """Witnesses of a metrics file's lines. Lines that are not JSON objects (a line cut short by
    a crash) and lines without ``ledger_head`` (older runs) are skipped."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise LedgerError(f"cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and LEDGER_HEAD_KEY in record:
            yield Witness.from_dict(record[LEDGER_HEAD_KEY], f"{path}:{number}")


def read_witnesses(path: Path | str) -> list[Witness]:
    """Every witness at ``path``: a run directory (its ``metrics.jsonl`` and checkpoint
    witnesses), a checkpoints directory, a checkpoint (``.pt``: its sidecar), a witness file,
    or a metrics file.

    Raises:
        LedgerError: nothing there, no witness in it, or a malformed witness (named by file and
            line).
    """
    path = Path(path)
    if path.is_dir():
        found: list[Witness] = []
        if (path / METRICS_FILE).is_file():
            found.extend(_metrics_witnesses(path / METRICS_FILE))
        for directory in (path / CHECKPOINT_DIR, path):
            for sidecar in sorted(directory.glob(f"*{WITNESS_SUFFIX}")):
                found.append(_read_sidecar(sidecar))
    elif path.name.endswith(WITNESS_SUFFIX):
        found = [_read_sidecar(path)]
    elif path.suffix == ".pt":
        witness = read_checkpoint_witness(path)
        if witness is None:
            raise LedgerError(f"checkpoint {path} has no witness ({checkpoint_witness_path(path)})")
        found = [witness]
    elif path.is_file():
        found = list(_metrics_witnesses(path))
    else:
        raise LedgerError(f"no run directory, checkpoint or witness file at {path}")
    if not found:
        raise LedgerError(f"no witnesses in {path} (no '{LEDGER_HEAD_KEY}' in its metrics, no "
                          f"*{WITNESS_SUFFIX} beside its checkpoints)")
    return found
