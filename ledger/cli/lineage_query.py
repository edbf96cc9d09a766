"""What ``ledger lineage``, ``ledger prompts`` and the lineage line of ``ledger show V`` ask of
a ledger, without folding the run (one snapshot each, answered by the builders of
:mod:`ledger.cli.lineage`):

- ``lineage --step N``: the step's ``batch_trained``, one lookup on the (run, kind, train_step)
  index;
- ``lineage V``: the commit of V (the unique version index), the steps that trained on its
  samples (``version_uses``, written with each ``batch_trained``), and the engines stamped with
  it: the ``engines_stamped`` events between the commit of V and the commit of V + 1 (a
  publisher stamps the version it committed before its next update; a fenced cell cannot
  stamp at all);
- ``prompts``: the run's :class:`~ledger.progress.Progress` from its newest trusted snapshot,
  plus the events after it;
- ``evals`` (and the scores of ``lineage V``): the run's ``eval_finished`` rows, on their own
  partial index.
"""

from __future__ import annotations

from typing import Any

from ledger.cli import lineage as answers
from ledger.cli.args import QueryError
from ledger.cli.session import run_header, select_run, snapshot
from ledger.events import EventKind, Head
from ledger.progress import load_progress
from ledger.provenance import parse_batch
from ledger.store.reads import Reader

__all__ = ["evals", "lineage", "prompts", "version_lineage"]


def lineage(url: str, run_id: str | None, version: int | None = None,
            step: int | None = None) -> dict[str, Any]:
    """``lineage V``: who produced V, the steps that trained on it, the engines that served it;
    ``lineage --step N``: what fed step N.

    Raises:
        QueryError: neither or both of ``version`` and ``step``; an unknown version; a step no
            ``batch_trained`` records; an unknown run.
    """
    if (version is None) == (step is None):
        raise QueryError("lineage takes a VERSION or --step N (one of them)")
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        header = run_header(run_id, head)
        if version is not None:
            return {"header": header, **version_lineage(reader, run_id, head, version)}
        assert step is not None
        event = reader.batch_at_step(run_id, step)
        if event is not None and event.seq > head.seq:
            event = None
        batch = None if event is None else parse_batch(event)
        return {"header": header, **answers.step_lineage(
            run_id, batch, step, reader.step_bounds(run_id))}


def version_lineage(reader: Reader, run_id: str, head: Head, version: int) -> dict[str, Any]:
    """The ``lineage V`` answer from indexed lookups in ``reader``'s snapshot.

    Raises:
        QueryError: ``version`` is not a version of the run.
    """
    answers.check_version(run_id, version, head.version)
    if version == 0:
        first = next(iter(reader.events(run_id, 1, 1)), None)
        produced_by = answers.initial_weights(first.recorded_at if first else None)
        commit_seq = 1
    else:
        commit = reader.event_at_version(run_id, version)
        produced_by = None if commit is None else {  # None: damaged, `ledger verify` names it
            "initial": False, "seq": commit.seq, "cell_id": commit.cell_id,
            "epoch": commit.epoch, "train_step": int(commit.payload.get("train_step", 0)),
            "transport": str(commit.payload.get("transport", "")),
            "adapter": commit.payload.get("adapter"), "checksum": commit.payload.get("checksum"),
            "recorded_at": commit.recorded_at.isoformat(),
        }
        commit_seq = commit.seq if commit is not None else 1
    following = reader.event_at_version(run_id, version + 1) if version < head.version else None
    last_seq = following.seq - 1 if following is not None else head.seq
    stamped: dict[str, int] = {}
    for event in reader.events_of_kind(run_id, EventKind.ENGINES_STAMPED.value, commit_seq,
                                       last_seq):
        if event.payload.get("version") == version:
            for engine_id in event.payload.get("engine_ids", []):
                stamped.setdefault(engine_id, event.seq)
    trained_by = []
    seen_steps: set[int] = set()
    for use in reader.version_uses(run_id, version):
        if use.seq > head.seq or use.train_step in seen_steps:
            continue  # a repeated step is an audit problem; the first record answers
        batch_event = next(iter(reader.events(run_id, use.seq, use.seq)), None)
        batch = None if batch_event is None else parse_batch(batch_event)
        if batch is None:
            continue
        seen_steps.add(use.train_step)
        trained_by.append({"train_step": use.train_step, "samples": use.samples,
                           "of_samples": batch.samples, "seq": use.seq,
                           "produced_version": batch.produced_version})
    trained_by.sort(key=lambda row: row["train_step"])
    engines = [{"engine_id": engine_id, "seq": seq} for engine_id, seq in sorted(stamped.items())]
    scored = [row for row in answers.eval_rows_of(reader.evals(run_id, head.seq))
              if row["version"] == version]
    return answers.version_answer(version, produced_by, trained_by, engines, scored)


def prompts(url: str, run_id: str | None) -> dict[str, Any]:
    """The run's prompt account at its last event: issued, trained, dropped by reason,
    recycled, in flight (from ``batch_trained`` and ``run_resumed`` events alone, folded from
    the newest trusted snapshot).

    Raises:
        QueryError: an unknown run.
    """
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        progress, _ = load_progress(reader, run_id, head.seq)
        first = next(iter(reader.events(run_id, 1, 1)), None)
        config = first.payload.get("config") if first is not None else None
        return {"header": run_header(run_id, head),
                **answers.prompt_account(progress, config if isinstance(config, dict) else None)}


def evals(url: str, run_id: str | None) -> dict[str, Any]:
    """Every ``eval_finished`` of the run: each eval set's scores over versions (the kind's
    events only, read in one snapshot).

    Raises:
        QueryError: an unknown run.
    """
    with snapshot(url) as (ledger, reader):
        run_id, head = select_run(ledger, reader, run_id)
        return {"header": run_header(run_id, head),
                "evals": answers.eval_rows_of(reader.evals(run_id, head.seq))}
