"""Prompt data: rows of local JSONL / Parquet files, checked, and the data set's identity.

:func:`load_prompt_rows` reads every file (Parquet with ``pyarrow.parquet``, JSONL line by
line with ``json``; nothing is fetched from a hub: a path that is not a local file is an error) and checks every row before anything is written: the input key holds a string or
a list of ``{role, content}`` messages, the label (when a label key is set) is present, the
metadata (when present) is a mapping. The first bad row fails the load with
:class:`PromptDataError`, one line naming the file and the 1-based row.

:class:`DatasetIdentity` is what ``run_started`` records and a resume compares: the files, their
row counts, and a sha256 over the rows' canonical JSON (so the same rows in another file name,
or re-encoded, are the same data set; one changed character is another).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.rollout.errors import PromptDataError

__all__ = ["DatasetIdentity", "PromptDataError", "PromptRow", "load_prompt_rows"]



@dataclass(frozen=True)
class PromptRow:
    """One row of the prompt data: the prompt (text or chat messages), its label, metadata."""

    input: str | tuple[dict[str, str], ...]
    label: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetIdentity:
    """Which data a run trains on: files, rows per file, and a digest of the rows' content."""

    files: tuple[str, ...]
    rows: tuple[int, ...]
    digest: str

    @property
    def total_rows(self) -> int:
        """Rows over every file: one epoch."""
        return sum(self.rows)

    def to_json(self) -> dict[str, Any]:
        """The JSON form recorded in ``run_started`` (``config["dataset"]``)."""
        return {"files": list(self.files), "rows": list(self.rows),
                "total_rows": self.total_rows, "digest": self.digest}


def load_prompt_rows(
    paths: Sequence[str], input_key: str, label_key: str | None, metadata_key: str | None,
) -> tuple[list[PromptRow], DatasetIdentity]:
    """Read and check every row of ``paths`` (JSONL or Parquet, in the order given).

    Raises:
        PromptDataError: no path, a file that does not exist or cannot be parsed, an unknown
            suffix, an empty file, or a row without the input (or label) key or with a value
            of the wrong type. Nothing is returned in part.
    """
    if not paths:
        raise PromptDataError("prompt_data: no file given")
    rows: list[PromptRow] = []
    counts: list[int] = []
    digest = hashlib.sha256()
    for path in paths:
        records = _read_records(Path(path))
        for number, record in enumerate(records, start=1):
            row = _row(record, input_key, label_key, metadata_key, f"{path}: row {number}")
            rows.append(row)
            digest.update(json.dumps(record, sort_keys=True, default=str).encode())
            digest.update(b"\n")
        counts.append(len(records))
    files = tuple(str(Path(path).resolve()) for path in paths)
    return rows, DatasetIdentity(files, tuple(counts), "sha256:" + digest.hexdigest())


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise PromptDataError(f"prompt_data: {path}: no such file (only local files are read)")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        records = _read_jsonl(path)
    elif suffix in (".parquet", ".pq"):
        records = _read_parquet(path)
    else:
        raise PromptDataError(f"prompt_data: {path}: unknown format (use .jsonl or .parquet)")
    if not records:
        raise PromptDataError(f"prompt_data: {path}: no rows")
    return records


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    # Line by line with the standard json module, not pyarrow.json: pyarrow wants one type per
    # column (a data set mixing string prompts and message lists is refused) and reports rows
    # 0-based; here a bad line is named by its 1-based row, as a user counts it.
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptDataError(f"prompt_data: {path}: unreadable: {exc}") from None
    for number, line in enumerate((line for line in lines if line.strip()), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptDataError(f"prompt_data: {path}: row {number}: unreadable JSON: "
                                  f"{exc.msg}") from None
        if not isinstance(record, dict):
            raise PromptDataError(f"prompt_data: {path}: row {number}: not a JSON object")
        records.append(record)
    return records


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        from pyarrow import parquet

        return parquet.read_table(str(path)).to_pylist()
    except Exception as exc:  # ArrowInvalid, OSError: not a readable Parquet file
        detail = " ".join(str(exc).split())
        raise PromptDataError(f"prompt_data: {path}: unreadable Parquet: {detail}") from None


def _row(record: dict[str, Any], input_key: str, label_key: str | None,
         metadata_key: str | None, where: str) -> PromptRow:
    value = record.get(input_key)
    if value is None:
        raise PromptDataError(f"prompt_data: {where}: no {input_key!r} (--input-key)")
    if isinstance(value, str):
        prompt: str | tuple[dict[str, str], ...] = value
    elif isinstance(value, list) and value and all(_is_message(m) for m in value):
        prompt = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in value)
    else:
        raise PromptDataError(f"prompt_data: {where}: {input_key!r} must be a string or a list "
                              "of {role, content} messages")
    label = ""
    if label_key is not None:
        if record.get(label_key) is None:
            raise PromptDataError(f"prompt_data: {where}: no {label_key!r} (--label-key)")
        label = str(record[label_key])
    metadata: Mapping[str, Any] = {}
    if metadata_key is not None and record.get(metadata_key) is not None:
        metadata = record[metadata_key]
        if not isinstance(metadata, dict):
            raise PromptDataError(f"prompt_data: {where}: {metadata_key!r} must be a mapping "
                                  "(--metadata-key)")
    return PromptRow(prompt, label, metadata)


def _is_message(message: object) -> bool:
    return (isinstance(message, dict) and message.get("role") is not None
            and message.get("content") is not None)
