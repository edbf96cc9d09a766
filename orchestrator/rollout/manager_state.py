"""The rollout manager's state file: prompt position and every unfinished prompt, as JSON.

The file holds the prompt source's next index and the data buffer's
:meth:`~orchestrator.rollout.data_buffer.DataBuffer.state_dict`, tagged with the run id and a
format number. The weight version is deliberately absent: a restored manager takes it from the
ledger. Writes are atomic and durable (:func:`ledger.store.atomic_files.write_text_atomically`:
temporary file, fsync, rename, fsync of the directory), so a crash mid-save leaves the older
file in place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ledger.store.atomic_files import write_text_atomically
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource

__all__ = ["STATE_FORMAT", "restore_state", "save_state", "write_state"]

STATE_FORMAT = 1


def save_state(
    path: str | os.PathLike[str], run_id: str, source: PromptSource, buffer: DataBuffer
) -> str:
    """Write ``source``'s position and ``buffer``'s unfinished prompts to ``path``, atomically.

    Returns the path written.

    Raises:
        OSError: the file could not be written; an older file at ``path`` is unchanged.
    """
    state = {
        "format": STATE_FORMAT,
        "run_id": run_id,
        "source": source.state_dict(),
        "buffer": buffer.state_dict(),
    }
    return _write_atomically(Path(path), state)


def _write_atomically(target: Path, state: dict[str, Any]) -> str:
    return str(write_text_atomically(target, json.dumps(state)))


def write_state(path: str | os.PathLike[str], run_id: str, *, next_index: int,
                pending: list[int], trained: int, dropped: dict[str, int]) -> str:
    """Write a state file from an account kept elsewhere (the ledger's ``batch_trained``
    events): the source position, the unfinished prompts to regenerate first (recycle counts
    start again at 0) and the totals. Returns the path written.

    Raises:
        ValueError: a pending prompt at or beyond ``next_index``.
        OSError: the file could not be written.
    """
    if any(index >= next_index for index in pending):
        raise ValueError("a pending prompt is beyond the source position")
    state = {
        "format": STATE_FORMAT,
        "run_id": run_id,
        "source": {"next_index": next_index},
        "buffer": {"pending": [[index, 0] for index in pending], "entered": next_index,
                   "trained": trained, "dropped": dict(dropped),
                   # Per-manager counters start again; the driver carries the run's totals.
                   "negative_staleness_total": 0, "missing_version_total": 0},
    }
    return _write_atomically(Path(path), state)


def restore_state(
    path: str | os.PathLike[str], run_id: str, source: PromptSource, buffer: DataBuffer
) -> int:
    """Load what :func:`save_state` wrote into a fresh ``source`` and an empty ``buffer``.

    The file is checked before anything is restored. Returns the number of pending prompts
    restored.

    Raises:
        ValueError: the file is for another run, another format, or malformed (a pending
            prompt beyond the saved source position included).
        RuntimeError: ``buffer`` already tracks prompts.
        OSError: the file cannot be read.
    """
    state = _read(path)
    if state.get("run_id") != run_id:
        raise ValueError(f"{path}: state of run {state.get('run_id')!r}, not {run_id!r}")
    try:
        saved_position = PromptSource(source.make)
        saved_position.load_state_dict(state["source"])
        pending = [int(index) for index, _ in state["buffer"]["pending"]]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed rollout manager state: {exc}") from None
    if any(index >= saved_position.next_index for index in pending):
        raise ValueError(f"{path}: a pending prompt is beyond the saved source position")
    buffer.load_state_dict(state["buffer"], source.make)
    source.load_state_dict(state["source"])
    return len(pending)


def _read(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a rollout manager state file: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: unknown rollout manager state format")
    return state
