"""Revision 0002 (idempotency key NOT NULL) upgrades a 0001 database that carries a run, on
SQLite and PostgreSQL; it refuses, changing nothing, a database holding a NULL key. Revision
0003 (derived train_step column, version_uses, snapshots, audit checkpoints) then rewrites no
row that 0001 held."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger
from ledger.cli.app import app
from ledger.errors import SchemaError
from ledger.migrate import head_revision, upgrade
from ledger.schema import ledger_events, metadata
from tests.cli_scenario import RUN_ID, build_run, frozen_clock
from tests.ledger_helpers import execute

ENV = {"COLUMNS": "200", "LEDGER_DB": None}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def _rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table revision 0001 has (its columns only), in primary-key order."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = {
            table.name: [
                tuple(row) for row in conn.execute(
                    sa.select(*(table.c[name] for name in _COLUMNS_0001[table.name]))
                    .order_by(*table.primary_key.columns)
                )
            ]
            for table in metadata.sorted_tables if table.name in _COLUMNS_0001
        }
    engine.dispose()
    return rows


_COLUMNS_0001 = {
    "runs": ["run_id", "created_at", "config"],
    "ledger_events": ["run_id", "seq", "kind", "version", "cell_id", "epoch", "idempotency_key",
                      "payload", "prev_hash", "hash", "recorded_at"],
    "run_heads": ["run_id", "last_seq", "head_version", "epoch", "publisher_cell", "head_hash"],
}


def _revision(url: str) -> str:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    return revision


@pytest.fixture
def at_0001(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database at revision 0001 holding the CLI scenario run, rows copied as 0001 code
    wrote them (the table shapes of 0001 and 0002 differ only in the key's nullability)."""
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    source = f"sqlite:///{tmp_path / 'source.db'}"
    with Ledger.open(source) as writer:
        build_run(writer)
    source_engine, target_engine = sa.create_engine(source), sa.create_engine(ledger_url)
    with target_engine.begin() as target:
        upgrade(target, "0001")
        with source_engine.connect() as rows:
            for table in metadata.sorted_tables:
                if table.name not in _COLUMNS_0001:
                    continue
                columns = [table.c[name] for name in _COLUMNS_0001[table.name]]
                values = [dict(row._mapping) for row in rows.execute(sa.select(*columns))]
                target.execute(table.insert(), values)
    source_engine.dispose()
    target_engine.dispose()
    assert _revision(ledger_url) == "0001"
    return ledger_url


def test_upgrade_from_0001_keeps_every_row_and_the_chain(at_0001: str):
    with pytest.raises(SchemaError, match="ledger db upgrade"):
        Ledger.open(at_0001, readonly=True)  # a reader never upgrades
    before_current = invoke("--db", at_0001, "db", "current")
    assert before_current.stdout == "0001 (head is 0003; run `ledger db upgrade`)\n"
    before = _rows(at_0001)

    upgraded = invoke("--db", at_0001, "db", "upgrade")

    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout.endswith(": 0001 -> 0003 (head)\n")
    assert _revision(at_0001) == head_revision() == "0003"
    assert _rows(at_0001) == before
    assert sum(len(rows) for rows in before.values()) == 1 + 20 + 1
    with Ledger.open(at_0001) as writer:
        report = writer.verify()
        assert report.ok, report.problems
        assert writer.head(RUN_ID).seq == 20
        assert writer.commit_weights(RUN_ID, cell_id="c1", epoch=2, train_step=5) == 5
    assert invoke("--db", at_0001, "verify").exit_code == 0


def test_after_the_upgrade_the_database_refuses_a_null_key(at_0001: str):
    Ledger.open(at_0001).close()
    engine = sa.create_engine(at_0001)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(ledger_events.insert().values(
            run_id=RUN_ID, seq=21, kind="cell_state", cell_id="c0", idempotency_key=None,
            payload={"state": "alive"}, prev_hash="0" * 64, hash="1" * 64,
            recorded_at=sa.func.now(),
        ))
    engine.dispose()


def test_upgrade_refuses_a_null_key_and_changes_nothing(at_0001: str):
    execute(
        at_0001,
        "UPDATE ledger_events SET idempotency_key = NULL WHERE run_id = :r AND seq IN (3, 13)",
        r=RUN_ID,
    )
    before = _rows(at_0001)

    with pytest.raises(SchemaError) as refused:
        Ledger.open(at_0001)
    cli = invoke("--db", at_0001, "db", "upgrade")

    message = str(refused.value)
    assert f"run {RUN_ID} seq 3, run {RUN_ID} seq 13" in message
    assert "cannot upgrade to revision 0002" in message
    assert cli.exit_code == 2 and "cannot upgrade to revision 0002" in cli.stderr
    assert _revision(at_0001) == "0001"
    assert _rows(at_0001) == before


def test_downgrade_to_0001_and_back(at_0001: str):
    from alembic import command

    from ledger.migrate import alembic_config

    Ledger.open(at_0001).close()
    engine = sa.create_engine(at_0001)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0001")
    engine.dispose()
    assert _revision(at_0001) == "0001"
    with Ledger.open(at_0001) as writer:
        assert writer.schema_revision() == "0003"
        assert writer.verify().ok
