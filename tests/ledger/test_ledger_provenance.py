"""Provenance in the ledger: the read model folds ``batch_trained`` events (steps, versions
trained on, the prompt account), and `ledger verify` names every provenance problem planted
behind the ledger's back (crafted events, raw row edits) by run and seq, on SQLite and
PostgreSQL; the clean lineage run has none."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger, fold
from ledger.cli.app import app
from ledger.provenance import prompt_digest
from ledger.schema import ledger_events
from tests.cli_scenario import LINEAGE_RUN_ID as RUN, build_lineage_run, frozen_clock
from tests.ledger_helpers import plant_event

ENV = {"COLUMNS": "200", "LEDGER_DB": None}
NEXT_SEQ = 22  # run-b ends at seq 21 (run_finished); a planted event lands here
PROVENANCE_CHECKS = {
    "batch_malformed", "step_twice", "version_above_head", "produced_uncommitted",
    "negative_staleness", "prompt_trained_twice", "prompt_trained_and_dropped",
    "prompt_past_stream", "prompt_carry_over", "prompt_balance", "samples_mismatch",
    "staleness_mismatch", "prompt_digest_mismatch", "resume_ledger_step",
}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture
def built(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The lineage scenario (tests/cli_scenario.py, run-b) on either backend."""
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    with Ledger.open(ledger_url) as writer:
        build_lineage_run(writer)
    return ledger_url


def batch(step: int = 5, **changes: Any) -> dict[str, Any]:
    """A well-formed ``batch_trained`` payload for a fifth step, with ``changes`` applied
    (``prompts`` keys go into the prompts object)."""
    prompts = {"trained": [9, 10], "dropped": {}, "recycled": 0, "next_index": 12}
    prompts.update(changes.pop("prompts", {}))
    payload = {
        "train_step": step, "trainer_version": 4, "produced_version": None,
        "cells": ["c1"], "groups": 2, "samples": 8, "sample_versions": {"3": 2, "4": 6},
        "token_version_span_max": 0, "mixed_version_samples": 0,
        "staleness": {"min": 0, "avg": 0.25, "max": 1},
        "prompt_digest": prompt_digest(prompts["trained"]), "prompts": prompts,
    }
    payload.update(changes)
    return payload


def plant_batch(**changes: Any) -> Callable[[str], None]:
    return lambda url: plant_event(url, RUN, kind="batch_trained", payload=batch(**changes))


def edit_payload(seq: int, change: Callable[[dict], None]) -> Callable[[str], None]:
    """Rewrite the payload of the event at ``seq`` in place, by a raw UPDATE (its hash is not
    recomputed, so ``hash_mismatch`` is named too)."""
    def plant(url: str) -> None:
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                where = (ledger_events.c.run_id == RUN) & (ledger_events.c.seq == seq)
                payload = conn.execute(sa.select(ledger_events.c.payload).where(where)).scalar()
                change(payload)
                conn.execute(ledger_events.update().where(where).values(payload=payload))
        finally:
            engine.dispose()
    return plant


def _set(path: list[str], value: Any) -> Callable[[dict], None]:
    def change(payload: dict) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


# name -> (plant, [(seq, check)] that verify must name)
DAMAGE: dict[str, tuple[Callable[[str], None], list[tuple[int, str]]]] = {
    "a prompt trained by two steps": (
        plant_batch(prompts={"trained": [8, 9]}), [(NEXT_SEQ, "prompt_trained_twice")],
    ),
    "a prompt trained and dropped (dropped after)": (
        plant_batch(prompts={"dropped": {"stale": [2]}}),
        [(NEXT_SEQ, "prompt_trained_and_dropped")],
    ),
    "a prompt trained and dropped (trained after)": (
        plant_batch(prompts={"trained": [6, 9]}), [(NEXT_SEQ, "prompt_trained_and_dropped")],
    ),
    "a prompt past the stream position": (
        plant_batch(prompts={"trained": [9, 12]}), [(NEXT_SEQ, "prompt_past_stream")],
    ),
    "a step trained on a version above the head": (
        plant_batch(sample_versions={"4": 6, "5": 2}), [(NEXT_SEQ, "version_above_head")],
    ),
    "a produced version that is not committed": (
        plant_batch(produced_version=9), [(NEXT_SEQ, "produced_uncommitted")],
    ),
    "a negative staleness min": (
        plant_batch(staleness={"min": -1, "avg": 0.0, "max": 1}),
        [(NEXT_SEQ, "negative_staleness")],
    ),
    "a train step recorded twice": (
        plant_batch(step=4), [(NEXT_SEQ, "step_twice")],
    ),
    "a malformed batch_trained": (
        lambda url: plant_event(url, RUN, kind="batch_trained", payload={"train_step": "five"}),
        [(NEXT_SEQ, "batch_malformed")],
    ),
    "a resume that carried over fewer prompts than were in flight": (
        lambda url: plant_event(url, RUN, kind="run_resumed", payload={
            "checkpoint_step": 4, "checkpoint_version": 4, "head_version": 4,
            "ledger_step": 4, "prompts_carried_over": 1, "next_prompt_index": 11}),
        [(NEXT_SEQ, "prompt_carry_over")],
    ),
    "a resume that skipped prompts": (
        lambda url: plant_event(url, RUN, kind="run_resumed", payload={
            "checkpoint_step": 4, "checkpoint_version": 4, "head_version": 4,
            "ledger_step": 4, "prompts_carried_over": 2, "next_prompt_index": 15}),
        [(NEXT_SEQ, "prompt_carry_over")],
    ),
    "a finished run whose producer's count does not balance": (
        lambda url: plant_event(url, RUN, kind="run_finished", payload={
            "steps": 4, "negative_staleness_total": 0, "prompts_unaccounted": 0,
            "prompts_issued": 12, "prompts_in_flight": 2}),
        [(NEXT_SEQ, "prompt_balance")],
    ),
    "a finished run with prompts unaccounted": (
        lambda url: plant_event(url, RUN, kind="run_finished", payload={
            "steps": 4, "negative_staleness_total": 0, "prompts_unaccounted": 3}),
        [(NEXT_SEQ, "prompt_balance")],
    ),
    # Claims verify re-derives from the ledger's own rows (issue 22): an independent raw-SQL
    # audit found each of these passing before.
    "a prompt_digest that is not the digest of the prompts trained": (
        plant_batch(prompt_digest="sha256:" + "0" * 64), [(NEXT_SEQ, "prompt_digest_mismatch")],
    ),
    "a recorded step whose prompts were rewritten, digest kept (raw UPDATE)": (
        edit_payload(20, _set(["prompts", "trained"], [[7, 9]])),
        [(20, "prompt_digest_mismatch"), (20, "hash_mismatch")],
    ),
    "a resume whose ledger_step is not the ledger's last step": (
        lambda url: plant_event(url, RUN, kind="run_resumed", payload={
            "checkpoint_step": 4, "checkpoint_version": 4, "head_version": 4,
            "ledger_step": 3, "prompts_carried_over": 2, "next_prompt_index": 11}),
        [(NEXT_SEQ, "resume_ledger_step")],
    ),
    "samples that disagree with sample_versions": (
        plant_batch(samples=9), [(NEXT_SEQ, "samples_mismatch")],
    ),
    "a staleness avg that disagrees with sample_versions": (
        plant_batch(staleness={"min": 0, "avg": 0.5, "max": 1}),
        [(NEXT_SEQ, "staleness_mismatch")],
    ),
    "a staleness span wider than the versions trained": (
        plant_batch(staleness={"min": 0, "avg": 1.25, "max": 2}),
        [(NEXT_SEQ, "staleness_mismatch")],
    ),
    "a forged cell_state payload": (
        lambda url: plant_event(url, RUN, kind="cell_state", cell_id="c0",
                                payload={"state": "zombie"}),
        [(NEXT_SEQ, "payload_invalid")],
    ),
    "a forged weight_update_started payload": (
        lambda url: plant_event(url, RUN, kind="weight_update_started", cell_id="c1", epoch=2,
                                payload={"train_step": -3, "transport": "full"}),
        [(NEXT_SEQ, "payload_invalid")],
    ),
    "a recorded step rewritten to a version above its head (raw UPDATE)": (
        edit_payload(16, _set(["sample_versions"], {"1": 2, "4": 6})),  # head was 3
        [(16, "version_above_head"), (16, "hash_mismatch")],
    ),
    "a recorded step rewritten to train a prompt twice (raw UPDATE)": (
        edit_payload(20, _set(["prompts", "trained"], [5, 8])),
        [(20, "prompt_trained_twice"), (20, "hash_mismatch")],
    ),
    "a prompt never issued, so the finished run does not balance (raw UPDATE)": (
        edit_payload(20, _set(["prompts", "trained"], [7, 11])),  # the stream ends at 11
        [(20, "prompt_past_stream"), (21, "prompt_balance")],
    ),
}


def test_the_clean_lineage_run_has_no_provenance_problem(built: str):
    result = invoke("--db", built, "verify", "--run", RUN)

    assert result.exit_code == 0, result.output
    with Ledger.open(built, readonly=True) as reader:
        report = reader.verify(RUN)
    assert report.ok, report.problems
    assert not {problem.check for problem in report.problems} & PROVENANCE_CHECKS


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_names_planted_provenance_damage_by_run_and_seq(built: str, damage: str):
    plant, expected = DAMAGE[damage]
    plant(built)

    result = invoke("--db", built, "verify")
    answer = json.loads(invoke("--db", built, "verify", "-o", "json").stdout)

    assert result.exit_code == 1, result.output
    for seq, check in expected:
        assert f"run {RUN} seq {seq}: {check}: " in result.stdout, result.stdout
    named = {(p["run_id"], p["seq"], p["check"]) for p in answer["problems"]}
    assert {(RUN, seq, check) for seq, check in expected} <= named


def test_the_read_model_folds_steps_versions_and_prompts(built: str):
    with Ledger.open(built, readonly=True) as reader:
        state = fold(RUN, reader.events(RUN))

    assert sorted(state.batches) == [1, 2, 3, 4]
    assert state.batches[3].sample_versions == {1: 2, 2: 6}
    assert state.batches[3].produced_version == 3
    assert state.provenance.steps_trained_on(2) == {3: 6, 4: 3}
    assert state.trained_on[0] == {1: 8, 2: 3}
    assert state.stamps[2] == {"e0": 9, "e1": 9}
    prompts = state.prompts
    assert prompts.issued == 11
    assert sorted(prompts.trained) == [0, 1, 2, 3, 4, 5, 7, 8]
    assert prompts.dropped_by_reason() == {"stale": 1}
    assert prompts.in_flight == [9, 10]
    assert prompts.recycled == 1 and prompts.last_step == 4 and prompts.twice == []


def test_the_orchestrator_reads_the_ledgers_prompt_account():
    from ledger import provenance
    from orchestrator.control import provenance_recorder as control

    assert control.PromptLedger is provenance.PromptLedger
    assert control.prompt_ledger is provenance.prompt_ledger


def test_lineage_of_an_unrecorded_step_or_version_is_a_one_line_error(built: str):
    step = invoke("--db", built, "--run", RUN, "lineage", "--step", "9")
    version = invoke("--db", built, "--run", RUN, "lineage", "7")
    neither = invoke("--db", built, "--run", RUN, "lineage")

    assert step.exit_code == 2 and "no batch_trained for step 9 (recorded: steps 1..4)" in (
        step.stderr)
    assert version.exit_code == 2 and "has no version 7 (head version is 4)" in version.stderr
    assert neither.exit_code == 2 and "VERSION or --step N" in neither.stderr


def test_an_unknown_kind_is_named_without_a_spurious_head_mismatch(built: str):
    plant_event(built, RUN, kind="telemetry", payload={"note": "from a newer writer"})

    with Ledger.open(built, readonly=True) as reader:
        report = reader.verify(RUN)

    checks = {(problem.seq, problem.check) for problem in report.problems}
    assert checks == {(NEXT_SEQ, "unknown_kind")}, report.problems
