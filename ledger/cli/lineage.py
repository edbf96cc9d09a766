"""Lineage and prompt answers built from the read model (no database access here).

:mod:`ledger.cli.lineage_query` (and :func:`ledger.cli.query.show`) replay a run into a
:class:`~ledger.projections.RunState` and call these builders; :mod:`ledger.cli.render_lineage`
prints what they return. Everything comes
from the ledger alone: commits (who produced a version), ``engines_stamped`` (who served it),
``batch_trained`` (which steps trained on it, what fed a step) and the prompt account.

- :func:`version_lineage`: ``ledger lineage V`` and the ``lineage`` line of ``ledger show V``;
- :func:`step_lineage`: ``ledger lineage --step N``;
- :func:`prompt_account`: ``ledger prompts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ledger.cli.args import QueryError
from ledger.epochs import dataset_rows, epoch_account
from ledger.progress import Progress
from ledger.events import Event
from ledger.provenance import BatchView, PromptLedger

if TYPE_CHECKING:  # folded by the caller; `show` and `lineage --step` never fold
    from ledger.projections import RunState

__all__ = ["prompt_account", "step_lineage", "summary_line", "version_lineage"]


def _time(state: RunState, version: int) -> str | None:
    commit = state.commits.get(version)
    return commit.recorded_at.isoformat() if commit else None


def version_lineage(state: RunState, version: int) -> dict[str, Any]:
    """Who produced ``version`` (0: the initial weights of ``run_started``), the steps that
    trained on samples generated under it, and the engines stamped with it (from a full
    fold; :mod:`ledger.cli.lineage_query` answers the same from indexed lookups).

    Raises:
        QueryError: ``version`` is not a version of the run.
    """
    check_version(state.run_id, version, state.head_version)
    commit = state.commits.get(version)
    produced_by: dict[str, Any] | None
    if version == 0:
        produced_by = initial_weights(state.started_at)
    elif commit is None:  # a damaged ledger: `ledger verify` names it
        produced_by = None
    else:
        produced_by = {"initial": False, "seq": commit.seq, "cell_id": commit.cell_id,
                       "epoch": commit.epoch, "train_step": commit.train_step,
                       "transport": commit.transport, "adapter": commit.adapter,
                       "checksum": commit.checksum, "recorded_at": _time(state, version)}
    trained_by = []
    for step, samples in state.provenance.steps_trained_on(version).items():
        batch = state.batches[step]
        trained_by.append({"train_step": step, "samples": samples, "of_samples": batch.samples,
                           "seq": batch.seq, "produced_version": batch.produced_version})
    engines = [{"engine_id": engine_id, "seq": seq}
               for engine_id, seq in sorted(state.stamps.get(version, {}).items())]
    scored = [row for row in eval_rows(state) if row["version"] == version]
    return version_answer(version, produced_by, trained_by, engines, scored)


def check_version(run_id: str, version: int, head_version: int) -> None:
    """Raises QueryError unless ``0 <= version <= head_version``."""
    if not 0 <= version <= head_version:
        raise QueryError(f"run {run_id!r} has no version {version} (head version is "
                         f"{head_version})")


def initial_weights(started_at: Any) -> dict[str, Any]:
    """The ``produced_by`` of version 0 (the weights ``run_started`` launched engines with)."""
    return {"initial": True, "seq": 1, "cell_id": None, "epoch": None, "train_step": 0,
            "transport": None, "adapter": None, "checksum": None,
            "recorded_at": started_at.isoformat() if started_at else None}


def version_answer(version: int, produced_by: dict[str, Any] | None,
                   trained_by: list[dict[str, Any]], engines: list[dict[str, Any]],
                   evals: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``lineage V`` answer from its parts (trained_by in step order, engines by id, the
    eval rows of V)."""
    answer = {"version": version, "produced_by": produced_by, "trained_by": trained_by,
              "trained_samples": sum(row["samples"] for row in trained_by), "engines": engines}
    if evals:  # only runs with --eval-prompt-data have the key
        answer["evals"] = evals
    answer["summary"] = summary_line(answer)
    return answer


def eval_rows(state: RunState) -> list[dict[str, Any]]:
    """Every ``eval_finished`` event: set, version, step, digest, metrics (seq order)."""
    return eval_rows_of(state.evals)


def eval_rows_of(events: Iterable[Event]) -> list[dict[str, Any]]:
    """:func:`eval_rows` of these ``eval_finished`` events."""
    rows = []
    for event in events:
        payload = event.payload
        if not isinstance(payload.get("metrics"), dict):
            continue  # malformed: `ledger verify` reads payloads, not this listing
        rows.append({"seq": event.seq, "name": payload.get("name"),
                     "version": payload.get("version"), "train_step": payload.get("train_step"),
                     "digest": payload.get("digest"), "prompts": payload.get("prompts"),
                     "samples_per_prompt": payload.get("samples_per_prompt"),
                     "metrics": payload["metrics"]})
    return rows


def summary_line(lineage: dict[str, Any]) -> str:
    """One line: ``produced by cell c0 epoch 1 step 2; trained on by steps 3 (6 samples), 4
    (3 samples); served by e0, e1``."""
    produced = lineage["produced_by"]
    if produced is None:
        who = "no commit on record"
    elif produced["initial"]:
        who = "initial weights (run_started)"
    else:
        who = (f"produced by cell {produced['cell_id']} epoch {produced['epoch']} step "
               f"{produced['train_step']}")
    steps = lineage["trained_by"]
    trained = "trained on by no step yet"
    if steps:
        listed = ", ".join(
            f"{row['train_step']} ({row['samples']} sample{'s' if row['samples'] != 1 else ''})"
            for row in steps
        )
        trained = f"trained on by step{'s' if len(steps) > 1 else ''} {listed}"
    engines = [row["engine_id"] for row in lineage["engines"]]
    served = f"served by {', '.join(engines)}" if engines else "stamped on no engine"
    return f"{who}; {trained}; {served}"


def _batch(batch: BatchView) -> dict[str, Any]:
    return {
        "train_step": batch.train_step,
        "seq": batch.seq,
        "recorded_at": batch.recorded_at.isoformat(),
        "trainer_version": batch.trainer_version,
        "produced_version": batch.produced_version,
        "cells": list(batch.cells),
        "groups": batch.groups,
        "samples": batch.samples,
        "sample_versions": [{"version": version, "samples": count}
                            for version, count in batch.sample_versions.items()],
        "staleness": {"min": batch.staleness_min, "avg": batch.staleness_avg,
                      "max": batch.staleness_max},
        "token_version_span_max": batch.token_version_span_max,
        "mixed_version_samples": batch.mixed_version_samples,
        "prompt_digest": batch.prompt_digest,
        "prompts": {
            "trained": batch.trained_count,
            "dropped": {reason: len(ids) for reason, ids in sorted(batch.prompts_dropped.items())},
            "recycled": batch.recycled,
            "next_index": batch.next_index,
        },
    }


def step_lineage(run_id: str, batch: BatchView | None, train_step: int,
                 recorded: tuple[int | None, int | None]) -> dict[str, Any]:
    """What fed ``train_step`` (its batch, None: unrecorded): versions with sample counts,
    staleness, groups and samples, the prompt digest, and the version it produced.

    Raises:
        QueryError: no ``batch_trained`` event records that step (``recorded``: the lowest
            and highest steps recorded).
    """
    if batch is None:
        known = f"steps {recorded[0]}..{recorded[1]}" if recorded[0] is not None else "none"
        raise QueryError(f"run {run_id!r} has no batch_trained for step {train_step} "
                         f"(recorded: {known})")
    return _batch(batch)


def prompt_account(state: Progress, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prompts issued, trained, dropped by reason, recycled, and in flight at the last event,
    with the balance ``issued == trained + dropped + in flight``."""
    prompts = state.prompts
    in_flight = prompts.in_flight
    dropped = prompts.dropped_by_reason()
    trained = len(prompts.trained)
    dropped_total = sum(dropped.values())
    return {
        "issued": prompts.issued,
        "trained": trained,
        "dropped": dropped,
        "dropped_total": dropped_total,
        "recycled": prompts.recycled,
        "in_flight": len(in_flight),
        "in_flight_prompts": in_flight,
        "carried_over": prompts.carried_over,
        "resumes": prompts.resumes,
        "steps_recorded": len(state.steps),
        "last_step": prompts.last_step,
        "last_step_seq": state.last_step_seq,
        "balanced": prompts.issued == trained + dropped_total + len(in_flight),
        "outcome": state.outcome,
        **_epochs(state.prompts, config),
    }


def _epochs(prompts: PromptLedger, config: dict[str, Any] | None) -> dict[str, Any]:
    """A data-set run's per-epoch account (``epochs``; ``config``: run_started's); nothing
    for the built-in task."""
    rows = dataset_rows(config)
    if rows is None or config is None:
        return {}
    return {"dataset": config["dataset"],
            "epochs": [epoch.to_json() for epoch in epoch_account(prompts, rows)]}
