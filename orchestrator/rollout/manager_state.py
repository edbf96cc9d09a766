"""The rollout manager's prompt state rebuilt from the ledger's account of its prompts.

The ledger's ``batch_trained`` events say where every prompt is (:mod:`ledger.provenance`):
the prompt stream's position, the prompts trained, dropped by reason, and those issued but
neither (in flight). A new manager (a resume, a replacement) continues from there: the stream
at the ledger's position and every in-flight prompt regenerated first, except the prompts of
a drained batch the driver holds and is about to train (``held``). No state file is written
or read; the weight version comes from the ledger head as always.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ledger.provenance import PromptLedger
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource

__all__ = ["restore_from_account"]


def restore_from_account(account: PromptLedger, source: PromptSource, buffer: DataBuffer, *,
                         held: Iterable[int] = ()) -> int:
    """Load the ledger's prompt ``account`` into a fresh ``source`` and an empty ``buffer``;
    returns the number of prompts to regenerate (recycle counts start again at 0).

    A held prompt may lie at or past the ledger's stream position: the lost manager issued it
    after the last ``batch_trained`` was recorded. The stream then continues past the newest
    held prompt (so none is issued again), and the prompts the lost manager issued below it
    that are not held are regenerated like any in-flight prompt.

    Raises:
        ValueError: the account has an in-flight prompt at or beyond its stream position;
            nothing was restored.
    """
    held_set = set(held)
    in_flight = set(account.in_flight)
    if any(index >= account.next_index for index in in_flight):
        raise ValueError("a pending prompt is beyond the ledger's prompt position")
    position = max(account.next_index, max(held_set, default=-1) + 1)
    issued_unrecorded = range(account.next_index, position)
    pending = [index for index in (*sorted(in_flight), *issued_unrecorded)
               if index not in held_set]
    settled_held = sum(1 for index in held_set
                       if index in in_flight or account.next_index <= index < position)
    state: dict[str, Any] = {
        "pending": [[index, 0] for index in pending], "entered": position,
        "trained": len(account.trained) + settled_held,
        "dropped": dict(account.dropped_by_reason()),
        # Per-manager counters start again; the driver carries the run's totals.
        "negative_staleness_total": 0, "missing_version_total": 0,
    }
    buffer.load_state_dict(state, source.make)
    source.load_state_dict({"next_index": position})
    return len(pending)
