"""The CLI reads a ledger through its driver alone (ledger.store.plain: sqlite3 or psycopg),
with the store's Reader and SQL: every answer equals the answer read through SQLAlchemy, on
both backends; the read commands never import it; anything but the plain case falls back to
the store."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import ledger.cli.session as session
from ledger import EventKind, Ledger, LedgerUnavailableError
from ledger.cli import lineage_query, query
from ledger.store.plain import open_plain_snapshot, plain_postgres_args, plain_sqlite_path
from ledger.store.reads import _EVALS
from tests.cli_scenario import LINEAGE_RUN_ID, RUN_ID, build_lineage_run, build_run
from tests.ledger_helpers import execute

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(ledger_url: str) -> str:
    with Ledger.open(ledger_url, snapshot_every=1) as writer:
        build_run(writer)
        build_lineage_run(writer)
    return ledger_url


_ANSWERS = {
    "status": lambda url: query.status(url, None),
    "runs": lambda url: query.runs(url),
    "lag": lambda url: query.lag(url, RUN_ID),
    "show 2": lambda url: query.show(url, RUN_ID, version=2),
    "show --seq 3": lambda url: query.show(url, RUN_ID, seq=3),
    "cells": lambda url: query.cells(url, RUN_ID),
    "verify": lambda url: query.verify(url, None),
    "verify --since-verified": lambda url: query.verify(url, None, since_verified=True),
    "lineage 2": lambda url: lineage_query.lineage(url, LINEAGE_RUN_ID, version=2),
    "lineage --step 3": lambda url: lineage_query.lineage(url, LINEAGE_RUN_ID, step=3),
    "prompts": lambda url: lineage_query.prompts(url, LINEAGE_RUN_ID),
    "log": lambda url: _log(url),
}


def _log(url: str) -> list[dict]:
    with query.log(url, RUN_ID) as answer:
        return [event.to_dict() for event in answer.events]


@pytest.mark.parametrize("command", sorted(_ANSWERS))
def test_every_answer_equals_the_one_read_through_the_store(
        url: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _ANSWERS[command](url)
    monkeypatch.setattr(session, "open_plain_snapshot", lambda url: None)

    through_store = _ANSWERS[command](url)

    assert plain == through_store


def test_the_plain_path_is_the_one_taken(url: str) -> None:
    snapshot = open_plain_snapshot(url)
    assert snapshot is not None
    with Ledger.open(url, readonly=True) as store:
        printed = (store.backend, store.url)
    with snapshot as (source, reader):
        assert (source.backend, source.url) == printed
        assert reader.head(RUN_ID).version == 4


@pytest.mark.parametrize("command", [["status"], ["lag"], ["show", "2"],
                                     ["lineage", "--step", "3", "--run", LINEAGE_RUN_ID],
                                     ["prompts", "--run", LINEAGE_RUN_ID], ["verify"]])
def test_the_read_commands_import_neither_sqlalchemy_nor_pydantic_nor_psycopg3(url: str, command: list[str]) -> None:
    program = ("import sys\nfrom ledger.cli import main\n"
               f"sys.argv = ['ledger', '--db', {url!r}, *{command!r}]\n"
               "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
               "else:\n    code = 0\n"
               "print('IMPORTED', sorted({m.split('.')[0] for m in sys.modules} & "
               "{'sqlalchemy', 'typer', 'alembic', 'pandas', 'matplotlib', 'pydantic', 'psycopg'}), code)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "LEDGER_DB": ""}, timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "IMPORTED [] 0"


def test_anything_but_the_plain_case_falls_back_to_the_store(sqlite_url: str, tmp_path: Path
                                                            ) -> None:
    assert plain_sqlite_path(sqlite_url + "?mode=ro") is None
    assert plain_sqlite_path("sqlite:///a%20b.db") is None  # SQLAlchemy would print it unquoted
    assert plain_sqlite_path("postgresql+psycopg://postgres@127.0.0.1/test") is None
    assert open_plain_snapshot(f"sqlite:///{tmp_path / 'missing.db'}") is None

    with Ledger.open(sqlite_url) as writer:
        build_run(writer)
    execute(sqlite_url, "UPDATE alembic_version SET version_num = '0003'")
    assert open_plain_snapshot(sqlite_url) is None
    with pytest.raises(Exception, match="schema revision 0003"):
        query.status(sqlite_url, None)  # the store's own error


@pytest.mark.parametrize(("url", "plain"), [
    ("postgresql+psycopg://u@h/db", ({"user": "u", "host": "h", "dbname": "db"},
                                     "postgresql+psycopg://u@h/db")),
    ("postgresql+psycopg://u:p%40ss@h:6543/db?options=-csearch_path%3Ds",
     ({"user": "u", "host": "h", "dbname": "db", "port": 6543, "password": "p@ss",
       "options": "-csearch_path=s"},
      "postgresql+psycopg://u:***@h:6543/db?options=-csearch_path%3Ds")),
    ("postgresql://u@h/db", None),  # the store moves it to psycopg and prints that
    ("postgresql+psycopg://u@h/db?sslmode=disable&application_name=x", None),  # not sorted
    ("postgresql+psycopg://u@h/db?options=-csearch_path=s", None),  # printed as %3D
    ("postgresql+psycopg://u@h/db?dbname=other", None),
    ("postgresql+psycopg://h/db", None),
])
def test_a_plain_postgres_url_is_one_the_store_prints_as_written(url: str, plain) -> None:
    assert plain_postgres_args(url) == plain


def test_a_versions_scores_come_from_the_eval_index(ledger_url: str) -> None:
    """``evals``, ``lineage V`` and ``show V`` read the run's eval_finished rows on their own
    partial index (revision 0005), not every event of the run."""
    with Ledger.open(ledger_url) as writer:
        build_lineage_run(writer)
        for version, score in ((1, 0.25), (2, 0.5), (2, 0.75)):
            writer.append(LINEAGE_RUN_ID, EventKind.EVAL_FINISHED, {
                "name": f"set-{score}", "version": version, "train_step": version,
                "digest": "sha256:x", "prompts": 4, "samples_per_prompt": 1,
                "metrics": {"reward": score}})

    scored = lineage_query.lineage(ledger_url, LINEAGE_RUN_ID, version=2)["evals"]
    every = lineage_query.evals(ledger_url, LINEAGE_RUN_ID)["evals"]

    assert [row["metrics"]["reward"] for row in scored] == [0.5, 0.75]
    assert [(row["version"], row["name"]) for row in every] == [
        (1, "set-0.25"), (2, "set-0.5"), (2, "set-0.75")]
    if ledger_url.startswith("sqlite"):
        with sqlite3.connect(plain_sqlite_path(ledger_url)) as conn:
            plan = conn.execute("EXPLAIN QUERY PLAN " + _EVALS,
                                {"run_id": LINEAGE_RUN_ID, "first": 1, "last": 99}).fetchall()
        assert "ix_ledger_events_evals" in " ".join(str(row) for row in plan)


def test_a_server_that_does_not_answer_is_reported_as_the_store_reports_it() -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2"
    with pytest.raises(LedgerUnavailableError) as through_store:
        Ledger.open(url, readonly=True)

    with pytest.raises(LedgerUnavailableError) as plain:
        query.status(url, None)

    assert str(plain.value) == str(through_store.value)
    assert str(plain.value).startswith("database unavailable: ")
