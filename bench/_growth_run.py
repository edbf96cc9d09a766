"""The run shape ``ledger_growth.py`` grows: steps like the main job's, written through the
ledger's own append path.

One step is four events, with the keys the main job uses: ``weight_update_started``,
``weight_committed``, ``engines_stamped`` (8 engines) and ``batch_trained`` (256 prompts, one
contiguous range, the common case). :func:`bulk_steps` writes many steps per transaction through
the same locked append the public API takes (:func:`ledger.store.append.append_locked`, after
the same payload validation), so its rows are the rows ``Ledger.append`` would write, only
committed in chunks: a 100k-step ledger takes minutes instead of an hour on two cores.
:func:`api_step` writes one step through the public API, one transaction per event, as the job
does; that is what the benchmark times.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ledger import EventKind, Ledger
from ledger.events import validate_payload
from ledger.provenance import prompt_digest
from ledger.store.append import append_locked, lock_head
from ledger.store.connection import transaction

__all__ = ["CELL", "ENGINES", "PROMPTS_PER_STEP", "api_step", "bulk_steps", "start"]

CELL = "cell-0"
ENGINES = [f"engine-{index}" for index in range(8)]
PROMPTS_PER_STEP = 256


def _batch_payload(step: int) -> dict[str, Any]:
    first = (step - 1) * PROMPTS_PER_STEP
    trained = list(range(first, first + PROMPTS_PER_STEP))
    version = max(step - 1, 0)
    return {
        "train_step": step, "trainer_version": version, "produced_version": step,
        "cells": [CELL], "groups": PROMPTS_PER_STEP // 8, "samples": PROMPTS_PER_STEP,
        "sample_versions": {str(version): PROMPTS_PER_STEP},
        "token_version_span_max": 0, "mixed_version_samples": 0,
        "staleness": {"min": 0, "avg": 0.0, "max": 0},
        "prompt_digest": prompt_digest(trained),
        "prompts": {"trained": trained, "dropped": {}, "recycled": 0,
                    "next_index": first + PROMPTS_PER_STEP},
    }


def _step_events(run_id: str, step: int, epoch: int) -> Iterator[tuple]:
    """(kind, payload, cell, epoch, key) of one step's four events, in order."""
    key = f"{run_id}:%s:{CELL}:e{epoch}:s{step}"
    yield (EventKind.WEIGHT_UPDATE_STARTED, {"train_step": step, "transport": "full"},
           CELL, epoch, key % "update_started")
    yield (EventKind.WEIGHT_COMMITTED,
           {"train_step": step, "transport": "full", "adapter": None,
            "checksum": f"{step:016x}"}, CELL, epoch, key % f"commit:{step:016x}")
    yield (EventKind.ENGINES_STAMPED, {"version": step, "engine_ids": ENGINES}, CELL, epoch,
           f"{run_id}:engines_stamped:v{step}:{CELL}:e{epoch}")
    yield (EventKind.BATCH_TRAINED, _batch_payload(step), None, None,
           f"{run_id}:batch_trained:{step}")


def start(ledger: Ledger, run_id: str) -> int:
    """Start the run and promote the cell; returns its epoch."""
    ledger.start_run(run_id, config={"bench": "ledger_growth"})
    return ledger.promote(run_id, CELL, reason="start")


def api_step(ledger: Ledger, run_id: str, step: int, epoch: int) -> None:
    """One step through the public API (four transactions)."""
    for kind, payload, cell, event_epoch, key in _step_events(run_id, step, epoch):
        ledger.append(run_id, kind, payload, cell_id=cell, epoch=event_epoch,
                      idempotency_key=key)


def bulk_steps(ledger: Ledger, run_id: str, first: int, last: int, epoch: int,
               chunk: int = 500) -> None:
    """Steps ``first..last`` through the locked append, ``chunk`` steps per transaction."""
    engine = ledger._engine  # noqa: SLF001 - the bench's bulk path; same append code
    for start_step in range(first, last + 1, chunk):
        with transaction(engine, "write") as conn:
            for step in range(start_step, min(start_step + chunk, last + 1)):
                for kind, payload, cell, event_epoch, key in _step_events(run_id, step, epoch):
                    head = lock_head(conn, run_id)
                    assert head is not None
                    event_kind, clean = validate_payload(kind, payload)
                    append_locked(conn, head, run_id, event_kind, clean, cell_id=cell,
                                  epoch=event_epoch, idempotency_key=key)
