"""No secrets in the ledger or on the terminal: a database password given in a URL (or in a
run's config) is never stored in the hash-chained history nor printed by the `ledger` command,
on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from ledger import Ledger, redact_text, redact_url, url_without_password
from ledger.cli.app import app
from ledger.cli.args import audit_command
from ledger.store.connection import translate
from tests.cli_scenario import RUN_ID, build_run
from tests.ledger_helpers import dump_tables

PASSWORD = "Hunter2-s3cret"
ENV = {"COLUMNS": "200", "LEDGER_DB": None}


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={**ENV, **(env or {})})


def with_password(url: str) -> str:
    """``url`` with a password for its user (the test server trusts local users and never asks
    for it, so the URL still connects)."""
    return sa.make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("postgresql+psycopg://trainer:" + PASSWORD + "@db:5432/runs",
         "postgresql+psycopg://trainer:***@db:5432/runs"),
        ("postgresql://trainer:p%40ss@db/runs", "postgresql://trainer:***@db/runs"),
        ("postgresql+psycopg://trainer@db/runs?password=" + PASSWORD + "&sslmode=require",
         "postgresql+psycopg://trainer@db/runs?password=***&sslmode=require"),
        ("postgresql+psycopg://trainer@db/runs", "postgresql+psycopg://trainer@db/runs"),
        ("sqlite:///runs/r1/ledger.db", "sqlite:///runs/r1/ledger.db"),
        ("not a url trainer:" + PASSWORD + "@db", "not a url trainer:" + PASSWORD + "@db"),
    ],
)
def test_redact_url(url: str, expected: str):
    assert redact_url(url) == expected


def test_redact_text_finds_passwords_in_free_text():
    text = (f"could not connect to postgresql://u:{PASSWORD}@h/db (host=h password={PASSWORD} "
            f"dbname=db); retrying mysql://root:{PASSWORD}@x/y")
    redacted = redact_text(text)
    assert PASSWORD not in redacted
    assert redacted.count("***") == 3


def test_driver_errors_are_redacted_where_they_are_translated():
    error = sa.exc.OperationalError(
        "SELECT 1", {}, Exception(f"connection to postgresql://u:{PASSWORD}@h/db failed")
    )
    assert PASSWORD not in str(translate(error))


def test_a_password_never_reaches_the_ledger(ledger_url: str):
    config = {"db": f"postgresql+psycopg://trainer:{PASSWORD}@db/runs", "lr": 0.1,
              "tracker": {"password": PASSWORD, "url": f"https://u:{PASSWORD}@wandb.local/x"}}
    with Ledger.open(ledger_url) as writer:
        started = writer.start_run(RUN_ID, config=config)
        stored_drill = writer.append(
            RUN_ID, "drill_started", {"scenario": "db-outage",
                                      "target": f"host=db password={PASSWORD}"},
        )
        rows = dump_tables(writer)
        report = writer.verify()

    assert PASSWORD not in json.dumps(rows)
    assert started.payload["config"]["db"] == "postgresql+psycopg://trainer:***@db/runs"
    assert started.payload["config"]["tracker"]["password"] == "***"
    assert stored_drill.payload["target"] == "host=db password=***"
    assert report.ok, report.problems  # runs.config equals the (redacted) hashed config


COMMANDS = [
    ["runs"], ["status"], ["status", "-o", "json"], ["log"], ["show", "4"], ["verify"],
    ["verify", "-o", "json"], ["cells"], ["lag"], ["export"], ["db", "current", "-o", "json"],
    ["db", "upgrade"],
]


@pytest.mark.postgres
def test_no_command_prints_the_password_of_its_url(pg_url: str):
    url = with_password(pg_url)
    with Ledger.open(url) as writer:
        build_run(writer)
        assert PASSWORD not in writer.url and "***" in writer.url

    outputs = [invoke("--db", url, *command) for command in COMMANDS]
    from_env = invoke("status", env={"LEDGER_DB": url})

    for command, result in zip(COMMANDS, outputs, strict=True):
        assert result.exit_code == 0, (command, result.output)
        assert PASSWORD not in result.output, command
    assert PASSWORD not in from_env.output and "postgres:***@" in from_env.stdout


@pytest.mark.parametrize(
    "url, fragment",
    [
        (f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/test?connect_timeout=2",
         "unavailable"),
        (f"mysql://root:{PASSWORD}@127.0.0.1/test", "unsupported database"),
        (f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/test?password={PASSWORD}",
         "unavailable"),
    ],
)
def test_no_error_prints_the_password_of_its_url(url: str, fragment: str):
    result = invoke("--db", url, "status")
    assert result.exit_code == 2
    assert fragment in result.stderr
    assert PASSWORD not in result.output


def test_url_without_password_is_runnable_and_secret_free():
    url = (f"postgresql+psycopg://trainer:{PASSWORD}@db:5432/runs?password={PASSWORD}"
           "&sslmode=require")
    assert url_without_password(url) == (
        "postgresql+psycopg://trainer@db:5432/runs?sslmode=require"
    )


def test_audit_command_names_the_run_directory_or_ledger_db(tmp_path):
    run_dir = tmp_path / "r1"
    local = Ledger.open(f"sqlite:///{run_dir / 'ledger.db'}")
    local.close()
    assert audit_command(f"sqlite:///{run_dir / 'ledger.db'}", "r1", run_dir) == (
        f"ledger verify --witness {run_dir}"
    )
    remote = audit_command(f"postgresql+psycopg://trainer:{PASSWORD}@db/runs", "r1", run_dir)
    assert remote == (
        "LEDGER_DB=postgresql+psycopg://trainer@db/runs ledger verify --run r1 "
        f"--witness {run_dir}"
    )
