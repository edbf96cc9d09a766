"""Print ``ledger lineage`` and ``ledger prompts`` answers (:mod:`ledger.cli.lineage`) as
``key  value`` lines plus a table, or as JSON; the same primitives as :mod:`ledger.cli.render`."""

from __future__ import annotations

from typing import Any, TextIO

from ledger.cli.render import _pairs, _print_table, _table, _text, _when, print_json
from ledger.audit.report import compact_ranges

__all__ = ["print_lineage", "print_prompts"]


def print_lineage(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """``lineage V`` or ``lineage --step N``, whichever the answer is."""
    if output == "json":
        print_json(answer, out)
    elif "train_step" in answer:
        _print_step(answer, out)
    else:
        _print_version(answer, out)


def _print_version(answer: dict[str, Any], out: TextIO) -> None:
    produced = answer["produced_by"]
    if produced is None:
        rows: list[tuple[str, Any]] = [("produced by", "no commit on record (run `ledger verify`)")]
    elif produced["initial"]:
        rows = [("produced by", "initial weights (run_started, seq 1)"),
                ("recorded at", _when(produced["recorded_at"]))]
    else:
        rows = [
            ("produced by", f"cell {produced['cell_id']}, epoch {produced['epoch']}, train step "
                            f"{produced['train_step']} (seq {produced['seq']})"),
            ("transport", produced["transport"] + (
                f" (adapter {produced['adapter']})" if produced["adapter"] else "")),
            ("checksum", produced["checksum"]),
            ("recorded at", _when(produced["recorded_at"])),
        ]
    engines = answer["engines"]
    served = ", ".join(f"{row['engine_id']} (seq {row['seq']})" for row in engines)
    steps = answer["trained_by"]
    _pairs(out, [
        ("version", answer["version"]),
        *rows,
        ("served by", served or "no engine stamped with it"),
        ("trained by", f"{len(steps)} step{'s' if len(steps) != 1 else ''}, "
                       f"{answer['trained_samples']} samples"),
    ])
    if steps:
        out.write("\n")
        table = _table("STEP", "SAMPLES", "OF", "PRODUCED", "SEQ")
        for row in steps:
            table.add_row(_text(row["train_step"]), _text(row["samples"]),
                          _text(row["of_samples"]), _text(row["produced_version"]),
                          _text(row["seq"]))
        _print_table(out, table)
    for row in answer.get("evals", []):
        metrics = ", ".join(f"{key} {value:.3f}" for key, value in row["metrics"].items())
        out.write(f"eval {row['name']}: {metrics} (step {row['train_step']}, seq {row['seq']})\n")


def print_evals(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """``ledger evals``: one row per eval set and version scored."""
    if output == "json":
        print_json(answer, out)
        return
    rows = answer["evals"]
    if not rows:
        out.write(f"run {answer['header']['run_id']}: no eval_finished events "
                  "(run with --eval-prompt-data and --eval-interval)\n")
        return
    table = _table("SET", "VERSION", "STEP", "PROMPTS", "METRICS", "SEQ")
    for row in rows:
        metrics = ", ".join(f"{key} {value:.3f}" for key, value in row["metrics"].items())
        table.add_row(_text(row["name"]), _text(row["version"]), _text(row["train_step"]),
                      _text(row["prompts"]), metrics, _text(row["seq"]))
    _print_table(out, table)


def _print_step(answer: dict[str, Any], out: TextIO) -> None:
    staleness = answer["staleness"]
    prompts = answer["prompts"]
    dropped = ", ".join(f"{reason} {count}" for reason, count in prompts["dropped"].items())
    _pairs(out, [
        ("train step", f"{answer['train_step']} (seq {answer['seq']})"),
        ("recorded at", _when(answer["recorded_at"])),
        ("trainer held", f"version {answer['trainer_version']}"),
        ("produced", "no version (not published)" if answer["produced_version"] is None
         else f"version {answer['produced_version']}"),
        ("cells", ", ".join(answer["cells"]) or "-"),
        ("groups", answer["groups"]),
        ("samples", f"{answer['samples']} ({answer['mixed_version_samples']} spanning versions, "
                    f"widest span {answer['token_version_span_max']})"),
        ("staleness", f"min {staleness['min']}, avg {staleness['avg']}, max {staleness['max']}"),
        ("prompts", f"{prompts['trained']} trained, dropped {dropped or 'none'}, "
                    f"{prompts['recycled']} recycled; stream at {prompts['next_index']}"),
        ("prompt digest", answer["prompt_digest"]),
    ])
    out.write("\n")
    table = _table("VERSION", "SAMPLES")
    for row in answer["sample_versions"]:
        table.add_row(_text(row["version"]), _text(row["samples"]))
    _print_table(out, table)


def print_prompts(answer: dict[str, Any], output: str, out: TextIO) -> None:
    """The prompt account, then its balance line."""
    if output == "json":
        print_json(answer, out)
        return
    dropped = ", ".join(f"{reason} {count}" for reason, count in answer["dropped"].items())
    in_flight = answer["in_flight_prompts"]
    last = (f"{answer['last_step']} (seq {answer['last_step_seq']})"
            if answer["last_step_seq"] is not None else "no batch_trained yet")
    _pairs(out, [
        ("run", answer["header"]["run_id"]),
        ("issued", answer["issued"]),
        ("trained", answer["trained"]),
        ("dropped", f"{answer['dropped_total']}" + (f" ({dropped})" if dropped else "")),
        ("recycled", answer["recycled"]),
        ("in flight", f"{answer['in_flight']}" + (
            f" (prompts {compact_ranges(in_flight)})" if in_flight else "")),
        ("carried over", f"{answer['carried_over']} ({answer['resumes']} "
                         f"resume{'s' if answer['resumes'] != 1 else ''})"),
        ("steps recorded", answer["steps_recorded"]),
        ("last step", last),
        ("run outcome", answer["outcome"] or "running (no terminal event)"),
    ])
    verdict, sign = ("balanced", "=") if answer["balanced"] else (
        "NOT BALANCED (run `ledger verify`)", "!=")
    out.write(f"{verdict}: issued {answer['issued']} {sign} trained {answer['trained']} + "
              f"dropped {answer['dropped_total']} + in flight {answer['in_flight']}\n")
    if "epochs" in answer:
        _print_epochs(answer, out)


def _print_epochs(answer: dict[str, Any], out: TextIO) -> None:
    """A data-set run: one line per epoch (rows trained, dropped by reason, in flight)."""
    dataset = answer["dataset"]
    out.write(f"data set: {dataset['total_rows']} rows in {len(dataset['files'])} file(s), "
              f"{dataset['digest'][:19]}...\n")
    out.write("epoch  rows  trained  dropped          in flight  not issued  check\n")
    for epoch in answer["epochs"]:
        dropped = ", ".join(f"{reason} {n}" for reason, n in epoch["dropped"].items()) or "0"
        settled = epoch["in_flight"] == 0 and epoch["not_issued"] == 0
        check = (("every row settled once" if settled else "balanced") if epoch["balanced"]
                 else f"NOT BALANCED ({epoch['trained_twice']} trained twice)")
        out.write(f"{epoch['epoch']:<5}  {epoch['rows']:<4}  {epoch['trained']:<7}  "
                  f"{dropped:<15}  {epoch['in_flight']:<9}  {epoch['not_issued']:<10}  "
                  f"{check}\n")
