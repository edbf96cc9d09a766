"""Every table cross-checked: damage planted by raw SQL, named by `ledger verify` (exit 1, run and
seq) on SQLite and PostgreSQL; a run that lost a row is listed as broken, never hidden; plain
`ledger verify` checks every run."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger, compact_ranges
from ledger.cli.app import app
from ledger.schema import run_heads, runs
from tests.cli_scenario import RUN_ID, build_run, frozen_clock
from tests.ledger_helpers import (
    execute,
    loosen_idempotency_key,
    plant_event,
    without_foreign_keys,
)

ENV = {"COLUMNS": "200", "LEDGER_DB": None}
LAST_SEQ = 20  # the scenario's head: seq 20, version 4, cell c1 epoch 2


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture
def built(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI scenario run (tests/cli_scenario.py) on either backend."""
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    with Ledger.open(ledger_url) as writer:
        build_run(writer)
    return ledger_url


def _set_config(url: str, config: dict) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(runs.update().where(runs.c.run_id == RUN_ID).values(config=config))
    engine.dispose()


def _phantom_head(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(run_heads.insert().values(
            run_id="phantom", last_seq=3, head_version=1, epoch=1, publisher_cell="c0",
            head_hash="f" * 64,
        ))
    engine.dispose()


def _loose_key(key: str | None) -> Callable[[str], None]:
    def plant(url: str) -> None:
        loosen_idempotency_key(url)
        plant_event(url, RUN_ID, kind="cell_state", payload={"state": "alive", "quorum_id": 3},
                    cell_id="c0", idempotency_key=key)
    return plant


# name -> (plant, [(run, seq, check)] that verify must name)
DAMAGE: dict[str, tuple[Callable[[str], None], list[tuple[str, int, str]]]] = {
    "head row deleted": (
        lambda url: execute(url, f"DELETE FROM run_heads WHERE run_id = '{RUN_ID}'"),
        [(RUN_ID, LAST_SEQ, "no_head_row")],
    ),
    "runs row deleted": (
        lambda url: without_foreign_keys(url, f"DELETE FROM runs WHERE run_id = '{RUN_ID}'"),
        [(RUN_ID, LAST_SEQ, "no_run_row")],
    ),
    "forged events of a run that has no rows": (
        lambda url: plant_event(
            url, "ghost", kind="weight_committed", cell_id="c9", epoch=7, version=1,
            payload={"train_step": 1, "transport": "full", "adapter": None, "checksum": None},
        ),
        [("ghost", 1, "no_run_row"), ("ghost", 1, "no_head_row"), ("ghost", 1, "no_promotion")],
    ),
    "head row without a run": (
        _phantom_head, [("phantom", 3, "no_run_row"), ("phantom", 3, "no_events")],
    ),
    "head row disagrees with the replay": (
        lambda url: execute(url, "UPDATE run_heads SET head_version = 5, epoch = 3"),
        [(RUN_ID, LAST_SEQ, "head_mismatch")],
    ),
    "runs.config edited": (
        lambda url: _set_config(url, {"cells": 2, "engines": 2, "max_weight_staleness": 99}),
        [(RUN_ID, 1, "config_mismatch")],
    ),
    "null idempotency key": (_loose_key(None), [(RUN_ID, 21, "null_idempotency_key")]),
    "duplicate idempotency key": (
        _loose_key("state:c0:alive"), [(RUN_ID, 21, "duplicate_idempotency_key")]
    ),
    "password in a payload": (
        lambda url: plant_event(
            url, RUN_ID, kind="cell_state", cell_id="c0",
            payload={"state": "alive", "db": "postgresql://trainer:hunter2@db/runs"},
        ),
        [(RUN_ID, 21, "credential")],
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_names_planted_damage_by_run_and_seq(built: str, damage: str):
    plant, expected = DAMAGE[damage]
    assert invoke("--db", built, "verify").exit_code == 0  # clean before
    plant(built)

    result = invoke("--db", built, "verify")
    answer = json.loads(invoke("--db", built, "verify", "-o", "json").stdout)

    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1].startswith("FAILED:")
    for run_id, seq, check in expected:
        assert f"run {run_id} seq {seq}: {check}: " in result.stdout, result.stdout
    named = {(p["run_id"], p["seq"], p["check"]) for p in answer["problems"]}
    assert set(expected) <= named
    with Ledger.open(built, readonly=True) as reader:
        report = reader.verify()
    assert not report.ok
    assert set(expected) <= {(p.run_id, p.seq, p.check) for p in report.problems}


def test_config_mismatch_names_the_edited_key(built: str):
    _set_config(built, {"cells": 2, "engines": 2, "max_weight_staleness": 99})
    result = invoke("--db", built, "verify", "--run", RUN_ID)
    assert (
        f"run {RUN_ID} seq 1: config_mismatch: runs.config differs from the config hashed in "
        "run_started (keys: max_weight_staleness)"
    ) in result.stdout


@pytest.mark.parametrize("damage", ["head row deleted", "runs row deleted"])
def test_a_run_that_lost_a_row_is_listed_as_broken(built: str, damage: str):
    DAMAGE[damage][0](built)

    listed = json.loads(invoke("--db", built, "runs", "-o", "json").stdout)["runs"]
    table = invoke("--db", built, "runs").stdout
    with Ledger.open(built, readonly=True) as reader:
        summaries = reader.runs()

    assert [(run["run_id"], run["state"], run["events"]) for run in listed] == [
        (RUN_ID, "broken", LAST_SEQ)
    ]
    missing = "no head row" if damage == "head row deleted" else "no runs row"
    assert listed[0]["problems"] == [missing]
    assert f"broken: {missing}" in table.splitlines()[1]
    assert [(s.run_id, s.broken, s.problems) for s in summaries] == [(RUN_ID, True, (missing,))]


def test_a_broken_run_is_an_error_for_one_run_commands(built: str):
    DAMAGE["head row deleted"][0](built)
    result = invoke("--db", built, "--run", RUN_ID, "status")
    assert result.exit_code == 2
    assert "is broken: it has no head row" in result.stderr


def test_plain_verify_checks_every_run_and_run_narrows_it(built: str):
    with Ledger.open(built) as writer:
        writer.start_run("run-b")  # the newest run, healthy
    execute(built, f"UPDATE ledger_events SET kind = 'cell_state' WHERE run_id = '{RUN_ID}' "
                   "AND seq = 6")

    everything = invoke("--db", built, "verify")
    newest = invoke("--db", built, "verify", "--run", "run-b")
    older = invoke("--db", built, "--run", RUN_ID, "verify")

    assert everything.exit_code == 1
    assert f"run {RUN_ID} seq 6: hash_mismatch: " in everything.stdout
    assert "(2 runs, 21 events checked)" in everything.stdout
    assert newest.exit_code == 0
    assert newest.stdout.splitlines()[-1] == "ok: 1 run, 1 events checked, no problems"
    assert older.exit_code == 1 and "(1 run, 20 events checked)" in older.stdout


def test_verify_of_an_unknown_run_is_a_one_line_error(built: str):
    result = invoke("--db", built, "verify", "--run", "nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("ledger: error: unknown run 'nope'")


def test_an_empty_ledger_verifies_with_zero_runs(ledger_url: str):
    Ledger.open(ledger_url).close()
    result = invoke("--db", ledger_url, "verify")
    assert result.exit_code == 0
    assert result.stdout == "ok: 0 runs, 0 events checked, no problems\n"


def test_compact_ranges_as_in_the_issue():
    versions = [*range(1, 58), 59, *range(61, 3401)]
    assert compact_ranges(versions) == "1-57, 59, 61-3400"
    assert compact_ranges([4]) == "4"
    assert compact_ranges(range(1, 60, 2), max_ranges=3) == (
        "1, 3, 5, ... and 27 more ranges (30 in all)"
    )


def test_unstamped_versions_print_as_capped_ranges(ledger_url: str):
    with Ledger.open(ledger_url) as writer:
        writer.start_run("long")
        epoch = writer.promote("long", "c0")
        for step in range(1, 131):
            version = writer.commit_weights("long", cell_id="c0", epoch=epoch, train_step=step)
            if version % 5 == 0:
                writer.append("long", "engines_stamped", {"version": version,
                                                          "engine_ids": ["e0"]},
                              cell_id="c0", epoch=epoch)

    verify = invoke("--db", ledger_url, "verify")
    lag = invoke("--db", ledger_url, "lag")

    expected = ", ".join(f"{first}-{first + 3}" for first in range(1, 100, 5))
    expected += ", ... and 6 more ranges (104 in all)"
    assert verify.exit_code == 0
    assert (f"note: run long: versions {expected} committed but not stamped on any engine"
            in verify.stdout)
    assert f"note: committed but never stamped: {expected}\n" in lag.stdout
    assert max(len(line) for line in verify.stdout.splitlines()) < 300
