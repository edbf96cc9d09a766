"""The CLI reads a SQLite file through the standard library's sqlite3 (ledger.store.plain),
with the store's Reader and SQL: every answer equals the answer read through SQLAlchemy, the
read commands never import it, and anything but the plain case falls back to the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ledger.cli.session as session
from ledger import Ledger
from ledger.cli import lineage_query, query
from ledger.store.plain import open_sqlite_snapshot, plain_sqlite_path
from tests.cli_scenario import LINEAGE_RUN_ID, RUN_ID, build_lineage_run, build_run
from tests.ledger_helpers import execute

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("plain") / "ledger.db"
    with Ledger.open(f"sqlite:///{path}", snapshot_every=1) as writer:
        build_run(writer)
        build_lineage_run(writer)
    return f"sqlite:///{path}"


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
    monkeypatch.setattr(session, "open_sqlite_snapshot", lambda url: None)

    through_store = _ANSWERS[command](url)

    assert plain == through_store


def test_the_plain_path_is_the_one_taken(url: str) -> None:
    snapshot = open_sqlite_snapshot(url)
    assert snapshot is not None
    with snapshot as (source, reader):
        assert (source.backend, source.url) == ("sqlite", url)
        assert reader.head(RUN_ID).version == 4


@pytest.mark.parametrize("command", [["status"], ["lag"], ["show", "2"],
                                     ["lineage", "--step", "3", "--run", LINEAGE_RUN_ID],
                                     ["prompts", "--run", LINEAGE_RUN_ID], ["verify"]])
def test_the_read_commands_never_import_sqlalchemy(url: str, command: list[str]) -> None:
    program = ("import sys\nfrom ledger.cli import main\n"
               f"sys.argv = ['ledger', '--db', {url!r}, *{command!r}]\n"
               "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
               "else:\n    code = 0\n"
               "print('IMPORTED', sorted({m.split('.')[0] for m in sys.modules} & "
               "{'sqlalchemy', 'typer', 'alembic', 'pandas', 'matplotlib'}), code)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "LEDGER_DB": ""}, timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "IMPORTED [] 0"


def test_anything_but_the_plain_case_falls_back_to_the_store(url: str, tmp_path: Path) -> None:
    assert plain_sqlite_path(url + "?mode=ro") is None
    assert plain_sqlite_path("sqlite:///a%20b.db") is None  # SQLAlchemy would render it
    assert plain_sqlite_path("postgresql+psycopg://postgres@127.0.0.1/test") is None
    assert open_sqlite_snapshot(f"sqlite:///{tmp_path / 'missing.db'}") is None

    old = tmp_path / "old.db"
    old.write_bytes(Path(plain_sqlite_path(url)).read_bytes())
    execute(f"sqlite:///{old}", "UPDATE alembic_version SET version_num = '0003'")
    assert open_sqlite_snapshot(f"sqlite:///{old}") is None
    with pytest.raises(Exception, match="schema revision 0003"):
        query.status(f"sqlite:///{old}", None)  # the store's own error
