"""Read-model snapshots, audit checkpoints and range-form prompt ids, on SQLite and PostgreSQL:
readers fold only the tail after a trusted snapshot and get what a full fold gets; verify
names a snapshot or checkpoint with a wrong state or a hash that is not the chain's; the
incremental verify checks only the events after its checkpoint; old flat prompt lists verify."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from ledger import EventKind, Ledger
from ledger.cli.app import app
from ledger.progress import Progress, load_engine_stamps, load_progress
from ledger.provenance import prompt_digest
from ledger.schema import audit_checkpoints, ledger_events, projection_snapshots
from tests.ledger_helpers import execute, loosen_idempotency_key, plant_event

RUN = "run-s"
ENV = {"COLUMNS": "200", "LEDGER_DB": None}


def _step(ledger: Ledger, step: int, epoch: int, prompts: list | None = None) -> None:
    version = ledger.commit_weights(RUN, cell_id="c0", epoch=epoch, train_step=step,
                                    idempotency_key=f"commit:{step}")
    ledger.append(RUN, EventKind.ENGINES_STAMPED, {"version": version, "engine_ids": ["e0"]},
                  cell_id="c0", epoch=epoch, idempotency_key=f"stamp:{step}")
    trained = prompts if prompts is not None else list(range(4 * (step - 1), 4 * step))
    ledger.append(RUN, EventKind.BATCH_TRAINED, {
        "train_step": step, "trainer_version": step - 1, "produced_version": version,
        "cells": ["c0"], "groups": 4, "samples": 8, "sample_versions": {str(step - 1): 8},
        "staleness": {"min": 0, "avg": 0.0, "max": 0}, "prompt_digest": prompt_digest(trained),
        "prompts": {"trained": trained, "dropped": {}, "recycled": 0, "next_index": 4 * step},
    }, idempotency_key=f"batch:{step}")


@pytest.fixture
def grown(ledger_url: str) -> str:
    """Six steps (step s: commit at 3s, stamp at 3s + 1, batch_trained at 3s + 2) with a
    snapshot and an audit checkpoint every 2 steps (seqs 8, 14, 20)."""
    with Ledger.open(ledger_url, snapshot_every=2) as ledger:
        ledger.start_run(RUN)
        epoch = ledger.promote(RUN, "c0", idempotency_key="promote")
        for step in range(1, 7):
            _step(ledger, step, epoch)
    return ledger_url


def _seqs(url: str, table: sa.Table) -> list[int]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        seqs = [row.seq for row in conn.execute(sa.select(table.c.seq).order_by(table.c.seq))]
    engine.dispose()
    return seqs


def _verify(url: str, *args: str) -> dict:
    result = CliRunner().invoke(app, ["--db", url, "verify", "-o", "json", *args], env=ENV)
    return json.loads(result.stdout)


def load_progress_of(ledger: Ledger) -> tuple[Progress, int]:
    """The run's progress as a resume reads it, and the seq it folded from."""
    with ledger.snapshot() as reader:
        return load_progress(reader, RUN, reader.head(RUN).seq)


def _full_fold(ledger: Ledger) -> dict:
    return Progress().fold(ledger.events(RUN)).to_json()


def test_snapshots_and_checkpoints_are_stored_every_k_steps(grown: str):
    assert _seqs(grown, projection_snapshots) == [8, 14, 20]
    assert _seqs(grown, audit_checkpoints) == [8, 14, 20]
    assert _verify(grown)["ok"]


def test_only_the_newest_states_are_kept(grown: str):
    """A state grows with the run, so one every K steps kept forever would grow the database
    with the square of the run: each table keeps the newest KEPT_STATES of a run."""
    from ledger.store.states import KEPT_STATES

    with Ledger.open(grown, snapshot_every=2) as ledger:
        for step in range(7, 11):  # snapshots and checkpoints at steps 8 and 10
            _step(ledger, step, 1)
        assert ledger.progress(RUN).to_json() == _full_fold(ledger)

    assert KEPT_STATES == 4
    assert _seqs(grown, projection_snapshots) == [14, 20, 26, 32]
    assert _seqs(grown, audit_checkpoints) == [14, 20, 26, 32]
    assert _verify(grown)["ok"] and _verify(grown, "--since-verified")["verified_from"] == \
        {RUN: 33}


def test_progress_from_the_snapshot_equals_a_full_fold(grown: str):
    with Ledger.open(grown, snapshot_every=0) as ledger:
        _step(ledger, 7, 1)  # a tail after the last snapshot
        progress = ledger.progress(RUN)
        assert progress.to_json() == _full_fold(ledger)
    assert progress.last_seq == 23 and progress.prompts.next_index == 28
    assert len(progress.prompts.trained) == 28 and progress.prompts.in_flight == []


def test_prompt_ids_are_stored_as_ranges(grown: str):
    with Ledger.open(grown, readonly=True) as ledger:
        batch = next(e for e in ledger.events(RUN) if e.kind == EventKind.BATCH_TRAINED)
    assert batch.payload["prompts"]["trained"] == [[0, 3]]
    assert batch.payload["prompt_digest"] == prompt_digest([0, 1, 2, 3])


def test_an_old_flat_prompt_list_still_verifies_and_folds(grown: str):
    trained = [24, 25, 27, 26]  # as a ledger before revision 0003 stored it
    plant_event(grown, RUN, kind="batch_trained", payload={
        "train_step": 7, "trainer_version": 6, "produced_version": None, "cells": ["c0"],
        "groups": 4, "samples": 8, "sample_versions": {"6": 8}, "token_version_span_max": 0,
        "mixed_version_samples": 0, "staleness": {"min": 0, "avg": 0.0, "max": 0},
        "prompt_digest": prompt_digest(trained),
        "prompts": {"trained": trained, "dropped": {}, "recycled": 0, "next_index": 28},
    })

    answer = _verify(grown)

    assert answer["ok"], answer["problems"]
    with Ledger.open(grown, readonly=True) as ledger:
        assert sorted(ledger.progress(RUN).prompts.trained) == list(range(28))


def _set_state(url: str, table: sa.Table, seq: int, **values) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.seq == seq).values(**values))
    engine.dispose()


def _forged_progress(url: str) -> dict:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        state = conn.execute(sa.select(projection_snapshots.c.state)
                             .where(projection_snapshots.c.seq == 14)).scalar_one()
    engine.dispose()
    state = json.loads(state) if isinstance(state, str) else state
    state["prompts"]["next_index"] = 99
    return state


def test_a_snapshot_with_a_wrong_state_is_a_verify_problem(grown: str):
    _set_state(grown, projection_snapshots, 14, state=_forged_progress(grown))

    answer = _verify(grown)

    assert not answer["ok"]
    assert [(p["seq"], p["check"]) for p in answer["problems"]] == [(14, "snapshot_mismatch")]
    assert "prompts" in answer["problems"][0]["message"]


def test_a_snapshot_whose_hash_is_not_the_chains_is_not_trusted(grown: str):
    forged = _forged_progress(grown)
    _set_state(grown, projection_snapshots, 20, state=forged, head_hash="a" * 64)

    answer = _verify(grown)
    with Ledger.open(grown, readonly=True) as ledger:
        progress = ledger.progress(RUN)
        full = _full_fold(ledger)

    assert [(p["seq"], p["check"]) for p in answer["problems"]] == [(20, "snapshot_hash")]
    assert progress.to_json() == full  # the reader fell back to the snapshot at seq 14


def _as_format_2(url: str, table: sa.Table, seq: int) -> dict:
    """Rewrite the stored state at ``seq`` as a ledger from before progression rows wrote it."""
    with Ledger.open(url, readonly=True) as ledger:
        progress = Progress().fold(ledger.events(RUN, 1, seq))
    old = progress.to_json(state_format=2)
    state = old if table is projection_snapshots else {
        "format": 1, "progress": old, "promoted_cells": ["c0"], "first_kind": "run_started"}
    _set_state(url, table, seq, state=state)
    return state


def test_a_snapshot_and_a_checkpoint_of_the_older_format_are_still_trusted(grown: str):
    for table in (projection_snapshots, audit_checkpoints):
        _as_format_2(grown, table, 20)

    with Ledger.open(grown, readonly=True) as ledger:
        progress, folded_from = load_progress_of(ledger)
        full = _full_fold(ledger)

    assert folded_from == 21 and progress.to_json() == full
    assert _verify(grown)["ok"]
    assert _verify(grown, "--since-verified")["verified_from"] == {RUN: 21}


def test_a_wrong_state_in_the_older_format_is_still_a_mismatch(grown: str):
    state = _as_format_2(grown, projection_snapshots, 14)
    state["prompts"]["trained"][0][2] = 5  # ids 0-3 trained by step 5, not 1
    _set_state(grown, projection_snapshots, 14, state=state)

    answer = _verify(grown)

    assert [(p["seq"], p["check"]) for p in answer["problems"]] == [(14, "snapshot_mismatch")]


def test_a_forged_audit_checkpoint_is_named_and_not_trusted(grown: str):
    # Hide a rewritten event behind a checkpoint: rewrite event 16 (its hash no longer
    # matches), then forge the newest checkpoint's hash: an incremental audit that trusted the
    # checkpoint at 20 would never look at event 16.
    execute(grown, "UPDATE ledger_events SET cell_id = 'c9' WHERE seq = 16")
    _set_state(grown, audit_checkpoints, 20, head_hash="b" * 64)

    incremental = _verify(grown, "--since-verified")

    assert incremental["verified_from"] == {RUN: 15}  # from the checkpoint at 14, not 20
    named = {(p["seq"], p["check"]) for p in incremental["problems"]}
    assert {(16, "hash_mismatch"), (20, "audit_checkpoint_hash")} <= named
    full = {(p["seq"], p["check"]) for p in _verify(grown)["problems"]}
    assert {(16, "hash_mismatch"), (20, "audit_checkpoint_hash")} <= full


def test_an_audit_checkpoint_with_a_wrong_state_is_a_full_verify_problem(grown: str):
    engine = sa.create_engine(grown)
    with engine.connect() as conn:
        state = conn.execute(sa.select(audit_checkpoints.c.state)
                             .where(audit_checkpoints.c.seq == 8)).scalar_one()
    engine.dispose()
    state = json.loads(state) if isinstance(state, str) else state
    state["promoted_cells"] = ["c0", "c7"]
    _set_state(grown, audit_checkpoints, 8, state=state)

    answer = _verify(grown)

    assert [(p["seq"], p["check"]) for p in answer["problems"]] == [
        (8, "audit_checkpoint_mismatch")]


def test_the_incremental_verify_checks_only_the_events_after_its_checkpoint(grown: str):
    with Ledger.open(grown, snapshot_every=0) as ledger:
        _step(ledger, 7, 1)
        report = ledger.verify_since_checkpoint(RUN)
        assert report.ok, report.problems
        assert (report.verified_from[RUN], report.events_checked) == (21, 3)
        # Damage in the tail is found; the clean audit above stored a checkpoint at 23.
        plant_event(grown, RUN, kind="engines_stamped", cell_id="c0", epoch=1,
                    payload={"version": 40, "engine_ids": ["e0"]})
        damaged = ledger.verify_since_checkpoint(RUN)
    assert damaged.verified_from[RUN] == 24 and damaged.events_checked == 1
    assert [(p.seq, p.check) for p in damaged.problems] == [(24, "stamp_uncommitted")]
    assert _seqs(grown, audit_checkpoints) == [8, 14, 20, 23]  # none stored past damage


def test_the_incremental_verify_names_a_tail_key_an_earlier_event_holds(grown: str):
    """Keys before the checkpoint are not in the checker's map: one indexed query finds the
    earlier holder of a tail event's key (possible only once the unique constraint is gone)."""
    loosen_idempotency_key(grown)
    plant_event(grown, RUN, kind="cell_state", cell_id="c0", payload={"state": "alive"},
                idempotency_key="stamp:2")  # the key of seq 7, before the checkpoint at 20

    with Ledger.open(grown, readonly=True) as ledger:
        report = ledger.verify_since_checkpoint(RUN, record=False)

    assert report.verified_from[RUN] == 21
    assert [(p.seq, p.check) for p in report.problems] == [(21, "duplicate_idempotency_key")]
    assert "already names seq 7" in report.problems[0].message


def test_lineage_of_a_step_and_a_version_come_from_indexed_lookups(grown: str):
    engine = sa.create_engine(grown)
    with engine.connect() as conn:
        steps = conn.execute(sa.select(ledger_events.c.seq, ledger_events.c.train_step)
                             .where(ledger_events.c.kind == "batch_trained")).all()
    engine.dispose()
    assert [tuple(row) for row in steps] == [(5, 1), (8, 2), (11, 3), (14, 4), (17, 5), (20, 6)]

    step = CliRunner().invoke(app, ["--db", grown, "lineage", "--step", "3", "-o", "json"],
                              env=ENV)
    version = CliRunner().invoke(app, ["--db", grown, "lineage", "2", "-o", "json"], env=ENV)

    assert json.loads(step.stdout)["seq"] == 11
    answer = json.loads(version.stdout)
    assert answer["trained_by"] == [{"train_step": 3, "samples": 8, "of_samples": 8,
                                     "seq": 11, "produced_version": 3}]
    assert answer["engines"] == [{"engine_id": "e0", "seq": 7}]


def test_lag_reads_the_snapshot_and_the_later_commits_and_stamps_as_a_full_fold(grown: str):
    with Ledger.open(grown, snapshot_every=0) as ledger:
        _step(ledger, 7, 1)  # a tail after the snapshot at seq 20: v7 stamped on e0
        version = ledger.commit_weights(RUN, cell_id="c0", epoch=1, train_step=8,
                                        idempotency_key="commit:8")  # v8, never stamped
        ledger.append(RUN, EventKind.ENGINES_STAMPED, {"version": 6, "engine_ids": ["e1"]},
                      cell_id="c0", epoch=1, idempotency_key="late-stamp")
    for forged in (False, True):
        if forged:  # an untrusted snapshot: both fold from event 1
            _set_state(grown, projection_snapshots, 20, head_hash="c" * 64)
        with Ledger.open(grown, readonly=True) as ledger, ledger.snapshot() as reader:
            stamps = load_engine_stamps(reader, RUN, reader.head(RUN).seq)
            full = Progress().fold(reader.events(RUN))

        assert (stamps.engines, stamps.unstamped_versions) == (
            full.engines, full.unstamped_versions)
        assert stamps.unstamped_versions == [version]
        assert {engine: view[0] for engine, view in stamps.engines.items()} == {"e0": 7, "e1": 6}
