"""The run shape ``ledger_growth.py`` grows: steps like the main job's, written through the
ledger's own append path.

One step is four events, with the keys the main job uses: ``weight_update_started``,
``weight_committed``, ``engines_stamped`` (8 engines) and ``batch_trained`` (256 prompts, one
contiguous range, the common case). 
:func:`bulk_rows` builds the large sizes: it computes the same rows the locked append computes (validated payload, seq, version, chained hash, derived
train_step and version_uses) and inserts them with one executemany per chunk; the benchmark's
full verify then checks every one of them.
:func:`api_step` writes one step through the public API, one transaction per event, as the job
does; that is what the benchmark times.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from datetime import UTC, datetime

from ledger import EventKind, Ledger
from ledger.events import event_hash
from ledger.payloads import validate_payload
from ledger.provenance import prompt_digest
from ledger.schema import ledger_events, run_heads, version_uses
from ledger.store.append import lock_head
from ledger.store.connection import transaction

__all__ = ["CELL", "ENGINES", "PROMPTS_PER_STEP", "api_step", "bulk_rows", "start"]

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


def bulk_rows(ledger: Ledger, run_id: str, first: int, last: int, epoch: int,
              chunk: int = 250) -> None:
    """Steps ``first..last`` as the rows the locked append would write, ``chunk`` steps per
    transaction and one executemany per table (the head row moved once per chunk)."""
    engine = ledger._engine  # noqa: SLF001 - the bench's bulk path
    for start_step in range(first, last + 1, chunk):
        with transaction(engine, "write") as conn:
            head = lock_head(conn, run_id)
            assert head is not None
            seq, version, prev = head.seq, head.version, head.hash
            events, uses = [], []
            for step in range(start_step, min(start_step + chunk, last + 1)):
                for kind, payload, cell, event_epoch, key in _step_events(run_id, step, epoch):
                    event_kind, clean = validate_payload(kind, payload)
                    seq += 1
                    row_version = None
                    if event_kind is EventKind.WEIGHT_COMMITTED:
                        version += 1
                        row_version = version
                    recorded_at = datetime.now(UTC).replace(tzinfo=None)
                    digest = event_hash(
                        prev_hash=prev, run_id=run_id, seq=seq, kind=event_kind.value,
                        version=row_version, cell_id=cell, epoch=event_epoch,
                        idempotency_key=key, payload=clean, recorded_at=recorded_at)
                    events.append({
                        "run_id": run_id, "seq": seq, "kind": event_kind.value,
                        "version": row_version, "cell_id": cell, "epoch": event_epoch,
                        "idempotency_key": key, "payload": clean,
                        "hash": digest, "recorded_at": recorded_at,
                        "train_step": clean.get("train_step")})
                    if event_kind is EventKind.BATCH_TRAINED:
                        uses += [{"run_id": run_id, "version": int(used), "seq": seq,
                                  "train_step": step, "samples": count}
                                 for used, count in clean["sample_versions"].items()]
                    prev = digest
            conn.execute(ledger_events.insert(), events)
            conn.execute(version_uses.insert(), uses)
            conn.execute(run_heads.update().where(run_heads.c.run_id == run_id).values(
                last_seq=seq, head_version=version, head_hash=prev))
