"""Golden output of every `ledger` subcommand, in table and json form.

The scenario (tests/cli_scenario.py) runs with a frozen clock and explicit idempotency keys, so
timestamps and hashes are the same on every machine; COLUMNS=120 fixes the table width; the
temporary directory is replaced by ``<TMP>``. Regenerate after an intended change with
``UPDATE_GOLDEN=1 pytest tests/ledger/test_ledger_cli_golden.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger
from ledger.cli.app import app
from tests.cli_scenario import LINEAGE_START, build_lineage_run, build_run, frozen_clock

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cli"

CASES: dict[str, list[str]] = {
    "runs": ["runs"],
    "runs.json": ["runs", "-o", "json"],
    "status": ["status"],
    "status.json": ["status", "-o", "json"],
    "log": ["log"],
    "log.json": ["log", "-o", "json", "-r", "12:14"],
    "log.jsonl": ["log", "-o", "jsonl", "-r", "-3"],
    "log_filtered": ["log", "-r", "5:head", "--kind", "weight_committed", "--cell", "c1"],
    "show_version": ["show", "3"],
    "show_version.json": ["show", "3", "-o", "json"],
    "show_seq": ["show", "--seq", "12"],
    "show_seq.json": ["show", "--seq", "12", "-o", "json"],
    "verify": ["verify"],
    "verify.json": ["verify", "-o", "json"],
    "verify_all_runs": ["verify", "--all-runs"],
    "verify_all_runs.json": ["verify", "--all-runs", "-o", "json"],
    "verify_problems": ["verify", "--db", "<TMP>/tampered.db"],
    "verify_problems.json": ["verify", "--db", "<TMP>/tampered.db", "-o", "json"],
    "cells": ["cells"],
    "cells.json": ["cells", "-o", "json"],
    "lag": ["lag"],
    "lag.json": ["lag", "-o", "json"],
    "export.jsonl": ["export", "--format", "jsonl"],
    "export.csv": ["export", "--format", "csv"],
    "plot": ["plot", "-o", "<TMP>/run.png"],
    "plot.json": ["plot", "-o", "<TMP>/run.png", "--format", "json"],
    "lineage": ["--run", "run-b", "lineage", "2"],
    "lineage.json": ["--run", "run-b", "lineage", "2", "-o", "json"],
    "lineage_initial": ["--run", "run-b", "lineage", "0"],
    "lineage_step": ["--run", "run-b", "lineage", "--step", "3"],
    "lineage_step.json": ["--run", "run-b", "lineage", "--step", "3", "-o", "json"],
    "show_version_lineage": ["--run", "run-b", "show", "2"],
    "prompts": ["--run", "run-b", "prompts"],
    "prompts.json": ["--run", "run-b", "prompts", "-o", "json"],
    "db_current": ["db", "current"],
    "db_current.json": ["db", "current", "-o", "json"],
    "db_upgrade": ["db", "upgrade"],
    "db_upgrade.json": ["db", "upgrade", "-o", "json"],
}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario runs (run-a; run-b, the lineage story, a day older) in
    ``<TMP>/ledger.db``, with run-a's metrics beside it."""
    base = tmp_path_factory.mktemp("golden")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger.store.append, "_utcnow", frozen_clock())
        with Ledger.open(f"sqlite:///{base / 'ledger.db'}") as writer:
            build_run(writer)
        patch.setattr(ledger.store.append, "_utcnow", frozen_clock(LINEAGE_START))
        with Ledger.open(f"sqlite:///{base / 'ledger.db'}") as writer:
            build_lineage_run(writer)
    lines = [
        {"step": 1, "rollout/fully_async/staleness_hist": {"0": 6, "1": 2}},
        {"step": 2, "rollout/fully_async/staleness_hist": {"0": 3, "1": 4, "2": 1}},
    ]
    (base / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    shutil.copy(base / "ledger.db", base / "tampered.db")
    with sqlite3.connect(base / "tampered.db") as conn:  # a gap and a rewritten train_step
        conn.execute("DELETE FROM ledger_events WHERE run_id = 'run-a' AND seq = 10")
        conn.execute(
            "UPDATE ledger_events SET payload = json_set(payload, '$.train_step', 7) "
            "WHERE run_id = 'run-a' AND seq = 16"
        )
    return base


@pytest.mark.parametrize("name", list(CASES))
def test_golden_output(scenario: Path, name: str):
    args = [arg.replace("<TMP>", str(scenario)) for arg in CASES[name]]
    result = CliRunner().invoke(
        app, ["--db", f"sqlite:///{scenario / 'ledger.db'}", *args],
        env={"COLUMNS": "120", "LEDGER_DB": None},
    )
    assert result.exit_code == (1 if name.startswith("verify_problems") else 0), result.output
    assert result.stderr == ""
    output = result.stdout.replace(str(scenario), "<TMP>")
    if name.endswith(".json"):
        json.loads(output)  # one well-formed document
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(output)
    assert output == golden.read_text()


FAST_COMMANDS = ("status", "lag", "show", "lineage", "prompts", "verify")
FAST = [name for name in CASES if "--all-runs" not in CASES[name] and (
    CASES[name][0] in FAST_COMMANDS
    or CASES[name][:2] == ["--run", "run-b"] and CASES[name][2] in FAST_COMMANDS)]


@pytest.mark.parametrize("name", FAST)
def test_the_fast_path_prints_the_golden_output(
    scenario: Path, name: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    """``ledger status``/``lag``/``show``/``lineage``/``prompts``/``verify`` answer without the
    typer app (ledger.cli.fast): the same bytes and exit code as the app's, golden file for
    golden file."""
    from ledger.cli import fast

    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("LEDGER_DB", raising=False)
    args = [arg.replace("<TMP>", str(scenario)) for arg in CASES[name]]

    code = fast.run(["--db", f"sqlite:///{scenario / 'ledger.db'}", *args])

    captured = capsys.readouterr()
    assert code == (1 if name.startswith("verify_problems") else 0) and captured.err == ""
    assert captured.out.replace(str(scenario), "<TMP>") == (GOLDEN / f"{name}.txt").read_text()


@pytest.mark.parametrize("args", [
    ["--run", "nope", "status"], ["show", "99"], ["show"], ["lineage", "--step", "77"],
    ["--run", "nope", "prompts"], ["--run", "nope", "verify", "--since-verified"],
])
def test_the_fast_path_reports_errors_as_the_app_does(
    scenario: Path, args: list[str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    from ledger.cli import fast

    monkeypatch.delenv("LEDGER_DB", raising=False)
    argv = ["--db", f"sqlite:///{scenario / 'ledger.db'}", *args]
    expected = CliRunner().invoke(app, argv, env={"COLUMNS": "120", "LEDGER_DB": None})

    code = fast.run(argv)

    captured = capsys.readouterr()
    assert (code, captured.out, captured.err) == \
        (expected.exit_code, expected.stdout, expected.stderr)
    assert code == 2 and captured.err.startswith("ledger: error: ")


@pytest.mark.parametrize("args", [
    ["status", "--help"], ["status", "-o", "yaml"], ["show", "-1"], ["log"],
    ["status", "--bogus"], ["-o", "json", "status"], ["show", "x"],
    ["verify", "--witness", "runs/x"], ["verify", "--all-runs"], ["prompts", "--since-verified"],
])
def test_anything_but_a_plain_read_command_goes_to_the_app(args: list[str]):
    from ledger.cli import fast

    assert fast.run(args) is None
