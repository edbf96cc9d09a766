"""Migrations create exactly ledger/schema.py; readers never create or upgrade anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from ledger import Ledger, LedgerError
from ledger.errors import SchemaError
from ledger.migrate import head_revision
from ledger.schema import metadata


def test_migrated_schema_has_no_drift_from_metadata(ledger_url: str):
    Ledger.open(ledger_url).close()
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        drift = compare_metadata(context, metadata)
    engine.dispose()
    assert drift == []


def test_writer_stamps_the_head_revision(ledger_url: str):
    with Ledger.open(ledger_url) as ledger:
        assert ledger.schema_revision() == head_revision()


def test_reopening_a_current_schema_changes_nothing(ledger_url: str):
    with Ledger.open(ledger_url) as ledger:
        ledger.start_run("r")
    with Ledger.open(ledger_url) as ledger:
        assert ledger.head("r").seq == 1


def test_reader_of_a_missing_sqlite_file_fails_and_creates_nothing(tmp_path: Path):
    missing = tmp_path / "nested" / "ledger.db"
    with pytest.raises(LedgerError, match="no ledger database"):
        Ledger.open(f"sqlite:///{missing}", readonly=True)
    assert not missing.exists() and not missing.parent.exists()


def test_reader_of_an_empty_database_fails_and_creates_no_table(ledger_url: str):
    with pytest.raises(SchemaError, match="no ledger schema"):
        if ledger_url.startswith("sqlite"):
            Path(sa.make_url(ledger_url).database).touch()
        Ledger.open(ledger_url, readonly=True)
    engine = sa.create_engine(ledger_url)
    assert sa.inspect(engine).get_table_names() == []
    engine.dispose()


def test_reader_of_an_old_schema_asks_for_an_upgrade(ledger_url: str):
    Ledger.open(ledger_url).close()
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0000'"))
    engine.dispose()
    with pytest.raises(SchemaError, match="ledger db upgrade"):
        Ledger.open(ledger_url, readonly=True)
    with pytest.raises(SchemaError):
        Ledger.open(ledger_url)  # a writer does not guess at a revision it does not know


@pytest.mark.parametrize(
    "url, message",
    [
        ("mysql://root@localhost/test", "unsupported database"),
        ("not a url", "not a database URL"),
        ("sqlite://", "in-memory"),
    ],
)
def test_bad_urls_are_refused_with_a_clear_error(url: str, message: str):
    with pytest.raises(LedgerError, match=message):
        Ledger.open(url)


def test_unreachable_postgres_is_a_ledger_error():
    with pytest.raises(LedgerError, match="unavailable"):
        Ledger.open("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")


def test_the_schema_head_constant_is_the_newest_migration():
    from ledger.migrate import SCHEMA_HEAD, script_head_revision

    assert SCHEMA_HEAD == script_head_revision()
