"""A small, deterministic run built through the public ledger API, for the CLI tests.

Story: cell c0 is promoted (epoch 1) and commits versions 1 and 2, both stamped on engines e0
and e1; its third update is aborted; c0 errors, c1 is promoted on failover (epoch 2), commits
and stamps version 3, saves a checkpoint, then commits version 4 and dies before stamping it.

A second run, ``run-b`` (:func:`build_lineage_run`), tells the lineage story: every training
step appends its ``batch_trained`` event after its commit; c0 trains steps 1-2, fails, c1 is
promoted on failover and trains steps 3-4; step 3 drops one stale prompt; the run finishes with
two prompts still in flight. It runs on its own clock a day earlier, so ``run-a`` stays the
newest (default) run and its hashes are unchanged.

Time is frozen (``frozen_clock``) and every idempotency key is explicit, so every hash, and
therefore every golden file, is the same on every machine and backend.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta

from ledger import EventKind, Ledger
from ledger.provenance import prompt_digest

RUN_ID = "run-a"
LINEAGE_RUN_ID = "run-b"
EPOCH_START = datetime(2026, 11, 29, 10, 0, 0)
LINEAGE_START = EPOCH_START - timedelta(days=1)


def frozen_clock(start: datetime = EPOCH_START) -> Callable[[], datetime]:
    """A stand-in for ``ledger.store.append._utcnow``: each call is 1.25 s after the previous one."""
    ticks = itertools.count()
    return lambda: start + timedelta(milliseconds=1250 * next(ticks))


def build_run(ledger: Ledger, run_id: str = RUN_ID) -> None:
    """Append the story above to ``run_id``."""
    ledger.start_run(run_id, config={"cells": 2, "engines": 2, "max_weight_staleness": 2})
    epoch = ledger.promote(run_id, "c0", reason="start", idempotency_key="promote:c0:1")
    for cell in ("c0", "c1"):
        ledger.append(
            run_id, EventKind.CELL_STATE, {"state": "alive", "quorum_id": 1},
            cell_id=cell, idempotency_key=f"state:{cell}:alive",
        )
    for step in (1, 2):
        _publish(ledger, run_id, "c0", epoch, step, stamp=True)
    ledger.append(
        run_id, EventKind.WEIGHT_UPDATE_STARTED, {"train_step": 3, "transport": "full"},
        cell_id="c0", epoch=epoch, idempotency_key="started:c0:3",
    )
    ledger.append(
        run_id, EventKind.WEIGHT_UPDATE_ABORTED,
        {"train_step": 3, "transport": "full", "reason": "engine e1 did not pause"},
        cell_id="c0", epoch=epoch, idempotency_key="aborted:c0:3",
    )
    ledger.append(
        run_id, EventKind.CELL_STATE, {"state": "errored", "quorum_id": 2},
        cell_id="c0", idempotency_key="state:c0:errored",
    )
    epoch = ledger.promote(
        run_id, "c1", reason="failover", previous_cell="c0", idempotency_key="promote:c1:2"
    )
    _publish(ledger, run_id, "c1", epoch, 3, stamp=True)
    ledger.append(
        run_id, EventKind.CHECKPOINT_SAVED,
        {"train_step": 3, "version": 3, "path": "runs/run-a/ckpt/step3"},
        cell_id="c1", epoch=epoch, idempotency_key="checkpoint:3",
    )
    _publish(ledger, run_id, "c1", epoch, 4, stamp=False)  # dies between commit and stamp


# step -> (cells, sample_versions, staleness, trained prompts, dropped, recycled, next index)
_LINEAGE_STEPS: dict[int, tuple] = {
    1: (["c0", "c1"], {"0": 8}, (0, 0.0, 0), [0, 1], {}, 0, 4),
    2: (["c0", "c1"], {"0": 3, "1": 5}, (0, 0.375, 1), [2, 3], {}, 1, 6),
    3: (["c1"], {"1": 2, "2": 6}, (0, 0.25, 1), [4, 5], {"stale": [6]}, 0, 9),
    4: (["c1"], {"2": 3, "3": 5}, (0, 0.375, 1), [7, 8], {}, 0, 11),
}


def build_lineage_run(ledger: Ledger, run_id: str = LINEAGE_RUN_ID) -> None:
    """Append the lineage story (module docstring) to ``run_id``: 4 steps, a failover after
    step 2, one ``batch_trained`` per step, ``run_finished`` with prompts 9-10 in flight."""
    ledger.start_run(run_id, config={"cells": 2, "engines": 2, "max_weight_staleness": 2})
    epoch = ledger.promote(run_id, "c0", reason="start", idempotency_key="promote:c0:1")
    for step in (1, 2, 3, 4):
        if step == 3:
            ledger.append(
                run_id, EventKind.CELL_STATE, {"state": "errored", "quorum_id": 2},
                cell_id="c0", idempotency_key="state:c0:errored",
            )
            epoch = ledger.promote(
                run_id, "c1", reason="failover", previous_cell="c0",
                idempotency_key="promote:c1:2",
            )
        cell = "c0" if step < 3 else "c1"
        _publish(ledger, run_id, cell, epoch, step, stamp=True)
        _batch_trained(ledger, run_id, step)
    ledger.append(
        run_id, EventKind.RUN_FINISHED,
        {"steps": 4, "negative_staleness_total": 0, "prompts_unaccounted": 0},
        idempotency_key="finished",
    )


def _batch_trained(ledger: Ledger, run_id: str, step: int) -> None:
    cells, versions, (low, avg, high), trained, dropped, recycled, next_index = (
        _LINEAGE_STEPS[step]
    )
    ledger.append(
        run_id, EventKind.BATCH_TRAINED,
        {
            "train_step": step, "trainer_version": step - 1, "produced_version": step,
            "cells": cells, "groups": len(trained), "samples": 4 * len(trained),
            "sample_versions": versions, "token_version_span_max": 1 if step > 1 else 0,
            "mixed_version_samples": 2 if step > 1 else 0,
            "staleness": {"min": low, "avg": avg, "max": high},
            "prompt_digest": prompt_digest(trained),
            "prompts": {"trained": trained, "dropped": dropped, "recycled": recycled,
                        "next_index": next_index},
        },
        idempotency_key=f"{run_id}:batch_trained:{step}",
    )


def _publish(
    ledger: Ledger, run_id: str, cell: str, epoch: int, step: int, *, stamp: bool
) -> None:
    ledger.append(
        run_id, EventKind.WEIGHT_UPDATE_STARTED, {"train_step": step, "transport": "full"},
        cell_id=cell, epoch=epoch, idempotency_key=f"started:{cell}:{step}",
    )
    version = ledger.commit_weights(
        run_id, cell_id=cell, epoch=epoch, train_step=step, transport="full",
        checksum=f"sha256:{step:04d}", idempotency_key=f"commit:{cell}:{step}",
    )
    if stamp:
        ledger.append(
            run_id, EventKind.ENGINES_STAMPED, {"version": version, "engine_ids": ["e0", "e1"]},
            cell_id=cell, epoch=epoch, idempotency_key=f"stamped:{version}",
        )
