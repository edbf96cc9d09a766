"""Revision 0002 (idempotency key NOT NULL) upgrades a 0001 database that carries a run, on
SQLite and PostgreSQL; it refuses, changing nothing, a database holding a NULL key. Revision
0003 (derived train_step column, version_uses, snapshots, audit checkpoints) then rewrites no
row that 0001 held, and revision 0004 (compact event rows) changes how they are stored but not
what they say: every field, the prev_hash readers derive included, reads back as 0001 stored
it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger
from ledger.cli.app import app
from ledger.errors import SchemaError
from ledger.migrate import head_revision, upgrade
from ledger.schema import ledger_events
from tests.cli_scenario import RUN_ID, build_run, frozen_clock
from tests.ledger_helpers import execute

ENV = {"COLUMNS": "200", "LEDGER_DB": None}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


_COLUMNS_0001 = {
    "runs": ["run_id", "created_at", "config"],
    "ledger_events": ["run_id", "seq", "kind", "version", "cell_id", "epoch", "idempotency_key",
                      "payload", "prev_hash", "hash", "recorded_at"],
    "run_heads": ["run_id", "last_seq", "head_version", "epoch", "publisher_cell", "head_hash"],
}
# Revision 0001's tables as a 0001 writer saw them (names only: the driver's plain types).
_TABLES_0001 = {name: sa.table(name, *(sa.column(column) for column in columns))
                for name, columns in _COLUMNS_0001.items()}


def _time(value: object) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _json(value: object) -> object:
    return json.loads(value) if isinstance(value, str) else value


def _rows(url: str) -> dict[str, list[tuple]]:
    """What every table revision 0001 has says (its columns only, in primary-key order): read
    raw from a database before revision 0004, and through the ledger's readers after it (where
    ``prev_hash`` is derived, the hash is stored as bytes and the time as an integer)."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        compact = _revision_on(conn) >= "0004"
        rows = {}
        for name, table in _TABLES_0001.items():
            if compact and name == "ledger_events":
                continue
            keys = [table.c[column] for column in _COLUMNS_0001[name][:2]]
            rows[name] = [tuple(row) for row in conn.execute(sa.select(table).order_by(*keys))]
    engine.dispose()
    rows["runs"] = [(run_id, _time(at), _json(config)) for run_id, at, config in rows["runs"]]
    if compact:
        with Ledger.open(url, readonly=True) as reader:
            rows["ledger_events"] = [
                (e.run_id, e.seq, e.kind, e.version, e.cell_id, e.epoch, e.idempotency_key,
                 e.payload, e.prev_hash, e.hash, e.recorded_at) for e in reader.events(RUN_ID)]
    else:
        rows["ledger_events"] = [(*row[:7], _json(row[7]), row[8], row[9], _time(row[10]))
                                 for row in rows["ledger_events"]]
    return rows


def _revision_on(conn: sa.Connection) -> str:
    return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()


def _revision(url: str) -> str:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        revision = _revision_on(conn)
    engine.dispose()
    return revision


@pytest.fixture
def at_0001(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database at revision 0001 holding the CLI scenario run, rows as 0001 code wrote them
    (the table shapes of 0001 and 0002 differ only in the key's nullability): built by today's
    code, then written into 0001's tables with each event's prev_hash, hex hash and time."""
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    source = f"sqlite:///{tmp_path / 'source.db'}"
    with Ledger.open(source) as writer:
        build_run(writer)
        events = [{"run_id": e.run_id, "seq": e.seq, "kind": e.kind, "version": e.version,
                   "cell_id": e.cell_id, "epoch": e.epoch, "idempotency_key": e.idempotency_key,
                   "payload": e.payload, "prev_hash": e.prev_hash, "hash": e.hash,
                   "recorded_at": e.recorded_at} for e in writer.events(RUN_ID)]
    source_engine, target_engine = sa.create_engine(source), sa.create_engine(ledger_url)
    with target_engine.begin() as target:
        upgrade(target, "0001")
        with source_engine.connect() as rows:
            for name in ("runs", "run_heads"):
                columns = [sa.column(column) for column in _COLUMNS_0001[name]]
                values = [dict(row._mapping) for row in
                          rows.execute(sa.select(*columns).select_from(sa.table(name)))]
                target.execute(_TABLES_0001[name].insert(), values)
        events_0001 = sa.Table("ledger_events", sa.MetaData(), autoload_with=target)
        target.execute(events_0001.insert(), events)
    source_engine.dispose()
    target_engine.dispose()
    assert _revision(ledger_url) == "0001"
    return ledger_url


def test_upgrade_from_0001_keeps_every_row_and_the_chain(at_0001: str):
    with pytest.raises(SchemaError, match="ledger db upgrade"):
        Ledger.open(at_0001, readonly=True)  # a reader never upgrades
    before_current = invoke("--db", at_0001, "db", "current")
    assert before_current.stdout == "0001 (head is 0006; run `ledger db upgrade`)\n"
    before = _rows(at_0001)

    upgraded = invoke("--db", at_0001, "db", "upgrade")

    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout.endswith(": 0001 -> 0006 (head)\n")
    assert _revision(at_0001) == head_revision() == "0006"
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
            payload={"state": "alive"}, hash="1" * 64, recorded_at=datetime(2026, 12, 1),
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
        assert writer.schema_revision() == "0006"
        assert writer.verify().ok


def test_upgrade_keeps_a_hand_edited_hash_for_the_audit_to_name(at_0001: str):
    """Revision 0004 stores hashes as bytes; one that is not 64 hex characters is kept as it
    was written, and the audit names its row afterwards, and the next (chained to it)."""
    execute(at_0001,
            "UPDATE ledger_events SET hash = 'not-a-digest' WHERE run_id = :r AND seq = 7",
            r=RUN_ID)

    assert invoke("--db", at_0001, "db", "upgrade").exit_code == 0

    with Ledger.open(at_0001, readonly=True) as reader:
        report = reader.verify()
    assert [(problem.seq, problem.check) for problem in report.problems] == \
        [(7, "hash_mismatch"), (8, "hash_mismatch")]
