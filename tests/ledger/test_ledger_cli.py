"""The `ledger` command, driven through typer's CliRunner on real SQLite files (and PostgreSQL).

Every user error is one line on stderr and exit code 2; verify exits 1 on a planted fault and
names the run and seq; read-only commands create nothing; no argument list yields a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger
from ledger.cli.app import app
from ledger.schema import micros_since_epoch
from ledger.events import event_hash
from tests.cli_scenario import RUN_ID, build_run, frozen_clock
from tests.ledger_helpers import derived_rows

ENV = {"COLUMNS": "120", "LEDGER_DB": None}
READ_ONLY_COMMANDS = [
    ["runs"], ["status"], ["log"], ["show", "1"], ["verify"], ["cells"], ["lag"],
    ["export"], ["db", "current"],
]


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={**ENV, **(env or {})})


@pytest.fixture
def built_url(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The scenario run (tests/cli_scenario.py) on a fresh SQLite file, time frozen."""
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    with Ledger.open(sqlite_url) as writer:
        build_run(writer)
    return sqlite_url


def db_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ledger: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------- read-only, user errors


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_leave_a_missing_path_missing(tmp_path: Path, command: list[str]):
    missing = tmp_path / "nested" / "ledger.db"
    result = invoke("--db", f"sqlite:///{missing}", *command)
    assert_one_line_error(result, "no ledger database")
    assert not missing.exists() and not missing.parent.exists()


@pytest.mark.parametrize("command", [*READ_ONLY_COMMANDS, ["plot", "-o", "x.png"]], ids=" ".join)
def test_every_command_without_a_database_says_how_to_name_one(command: list[str]):
    result = invoke(*command)
    assert_one_line_error(result, "no database: pass --db URL")


def _empty_file(url: str) -> str:
    Path(sa.make_url(url).database).with_name("empty.db").touch()
    return url.replace("ledger.db", "empty.db")


def _raw_sql(url: str, statement: str) -> str:
    """Run one statement behind the ledger's back; returns ``url`` for chaining."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(statement))
    engine.dispose()
    return url


def _old_schema(url: str) -> str:
    return _raw_sql(url, "UPDATE alembic_version SET version_num = '0000'")


def _corrupt_payload(url: str) -> str:
    return _raw_sql(url, "UPDATE ledger_events SET payload = '{not json' WHERE seq = 5")


def _corrupt_time(url: str) -> str:
    return _raw_sql(url, "UPDATE runs SET created_at = 'yesterday'")


USER_ERRORS = {
    "wrong scheme": (lambda url: "mysql://root@localhost/test", ["status"], "unsupported"),
    "not a url": (lambda url: "sqlite://", ["status"], "in-memory"),
    "unknown run": (lambda url: url, ["--run", "nope", "status"], "unknown run 'nope'"),
    "no schema": (_empty_file, ["status"], "no ledger schema"),
    "old schema": (_old_schema, ["log"], "ledger db upgrade"),
    "bad range": (lambda url: url, ["log", "-r", "9:3"], "bad range '9:3'"),
    "range syntax": (lambda url: url, ["log", "-r", "x:head"], "bad range"),
    "range end -N": (lambda url: url, ["log", "-r", "1:-2"], "can only start"),
    "bad time": (lambda url: url, ["log", "--since", "noon"], "--since"),
    "bad kind": (lambda url: url, ["log", "--kind", "commit"], "unknown event kind"),
    "no version": (lambda url: url, ["show", "7"], "no version 7"),
    "no seq": (lambda url: url, ["show", "--seq", "99"], "no seq 99"),
    "corrupt payload": (_corrupt_payload, ["log"], "corrupt event row"),
    "corrupt payload show": (_corrupt_payload, ["show", "--seq", "5"], "corrupt"),
    "corrupt time": (_corrupt_time, ["runs"], "corrupt row"),
    "unreachable": (
        lambda url: "postgresql+psycopg://postgres@127.0.0.1:1/test", ["status"], "unavailable"
    ),
    "missing metrics": (
        lambda url: url, ["plot", "-o", "never.png", "--metrics", "none.jsonl"], "no metrics"
    ),
}


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_user_errors_print_one_line_exit_2_and_change_nothing(
    built_url: str, sqlite_path: Path, case: str
):
    plant, args, fragment = USER_ERRORS[case]
    url = plant(built_url)
    before = db_digest(sqlite_path)

    result = invoke("--db", url, *args)

    assert_one_line_error(result, fragment)
    assert db_digest(sqlite_path) == before
    assert not Path("never.png").exists()


@pytest.mark.parametrize(
    "args", [["bogus"], ["log", "-o", "xml"], ["show", "abc"], ["plot"], ["export", "-o", "json"]]
)
def test_usage_errors_exit_2(built_url: str, args: list[str]):
    result = invoke("--db", built_url, *args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------- verify


def _execute(url: str, statement: str, **params) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(statement), params)
    engine.dispose()


def _plant_event(url: str, *, kind: str, cell_id: str, epoch: int, payload: dict,
                 version: int | None = None, publisher: str | None = None) -> int:
    """Append a row by raw SQL with a *valid* hash chain and head row, bypassing fencing.

    Only the invariant the row breaks can then fire: the audit must catch it on its own.
    """
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        head = conn.execute(
            sa.text("SELECT last_seq, head_version, epoch, publisher_cell, head_hash "
                    "FROM run_heads WHERE run_id = :r"), {"r": RUN_ID},
        ).one()
        seq = head.last_seq + 1
        recorded_at = datetime(2026, 11, 29, 11, 0, 0)
        key = f"planted:{seq}"
        digest = event_hash(
            prev_hash=head.head_hash, run_id=RUN_ID, seq=seq, kind=kind, version=version,
            cell_id=cell_id, epoch=epoch, idempotency_key=key, payload=payload,
            recorded_at=recorded_at,
        )
        conn.execute(
            sa.text("INSERT INTO ledger_events (run_id, seq, kind, version, cell_id, epoch, "
                    "idempotency_key, payload, hash, recorded_at, train_step) "
                    "VALUES (:r, :seq, :kind, :version, :cell, :epoch, :key, :payload, "
                    ":hash, :at, :step)"),
            {"r": RUN_ID, "seq": seq, "kind": kind, "version": version, "cell": cell_id,
             "epoch": epoch, "key": key, "payload": json.dumps(payload),
             "hash": bytes.fromhex(digest),
             "at": (micros_since_epoch(recorded_at) if conn.dialect.name == "sqlite"
                    else recorded_at),
             "step": derived_rows(RUN_ID, seq, kind, payload)[0]},
        )
        for use in derived_rows(RUN_ID, seq, kind, payload)[1]:
            conn.execute(sa.text("INSERT INTO version_uses (run_id, version, seq, train_step, "
                                 "samples) VALUES (:run_id, :version, :seq, :train_step, "
                                 ":samples)"), use)
        conn.execute(
            sa.text("UPDATE run_heads SET last_seq = :seq, head_hash = :hash, "
                    "head_version = :version, publisher_cell = :publisher WHERE run_id = :r"),
            {"seq": seq, "hash": digest, "version": version or head.head_version,
             "publisher": publisher or head.publisher_cell, "r": RUN_ID},
        )
    engine.dispose()
    return seq


def test_verify_of_the_scenario_is_clean_and_notes_the_unstamped_version(built_url: str):
    result = invoke("--db", built_url, "verify")
    assert result.exit_code == 0, result.output
    assert "note: run run-a: version 4 committed but not stamped" in result.stdout
    assert result.stdout.splitlines()[-1] == "ok: 1 run, 20 events checked, no problems"


def test_verify_catches_a_gap(built_url: str):
    _execute(built_url, "DELETE FROM ledger_events WHERE seq = 10")
    result = invoke("--db", built_url, "verify")
    assert result.exit_code == 1
    assert "run run-a seq 11: seq_gap: expected seq 10, found 11" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("FAILED:")


def test_verify_catches_a_tampered_payload(built_url: str):
    payload = {"train_step": 99, "transport": "full", "adapter": None, "checksum": "sha256:0002"}
    _execute(built_url, "UPDATE ledger_events SET payload = :p WHERE seq = 9",
             p=json.dumps(payload))
    result = invoke("--db", built_url, "verify")
    assert result.exit_code == 1
    assert "run run-a seq 9: hash_mismatch:" in result.stdout


def test_verify_catches_a_commit_from_a_fenced_epoch(built_url: str):
    seq = _plant_event(
        built_url, kind="weight_committed", cell_id="c0", epoch=1, version=5,
        payload={"train_step": 5, "transport": "full", "adapter": None, "checksum": None},
    )
    result = invoke("--db", built_url, "verify")
    assert result.exit_code == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith("run ")]
    assert problems == [
        f"run run-a seq {seq}: fenced_write: weight_committed from cell c0 epoch 1; "
        "publisher is cell c1 epoch 2"
    ]


def test_verify_catches_an_epoch_that_went_down(built_url: str):
    seq = _plant_event(
        built_url, kind="cell_promoted", cell_id="c0", epoch=1, publisher="c0",
        payload={"reason": "manual", "previous_cell": "c1"},
    )
    result = invoke("--db", built_url, "verify", "-o", "json")
    assert result.exit_code == 1
    answer = json.loads(result.stdout)
    assert answer["ok"] is False
    assert answer["problems"] == [
        {"run_id": RUN_ID, "seq": seq, "check": "epoch_order",
         "message": "promotion of cell c0 to epoch 1; expected 3"}
    ]


def test_verify_all_runs_names_the_run_with_the_problem(built_url: str):
    with Ledger.open(built_url) as writer:
        writer.start_run("run-b")
    _execute(built_url, "UPDATE ledger_events SET kind = 'cell_state' WHERE seq = 6")
    result = invoke("--db", built_url, "verify", "--all-runs")
    assert result.exit_code == 1
    assert "run run-a seq 6:" in result.stdout and "run run-b" not in result.stdout
    assert "(2 runs, 21 events checked)" in result.stdout


# ---------------------------------------------------------------------- queries


def test_default_run_is_the_newest_and_options_work_before_or_after_the_command(
    built_url: str,
):
    with Ledger.open(built_url) as writer:
        writer.start_run("run-b")
    newest = json.loads(invoke("--db", built_url, "status", "-o", "json").stdout)
    assert newest["run_id"] == "run-b"
    before = invoke("--db", built_url, "--run", RUN_ID, "status", "-o", "json").stdout
    after = invoke("status", "--db", built_url, "--run", RUN_ID, "-o", "json").stdout
    from_env = invoke("status", "--run", RUN_ID, "-o", "json", env={"LEDGER_DB": built_url})
    assert before == after == from_env.stdout
    assert json.loads(before)["header"]["version"] == 4


def test_a_bare_path_means_a_sqlite_file(built_url: str, sqlite_path: Path):
    result = invoke("--db", str(sqlite_path), "status", "-o", "json")
    assert json.loads(result.stdout)["last_seq"] == 20


@pytest.mark.parametrize(
    "args, seqs",
    [
        (["-r", "18:head"], [18, 19, 20]),
        (["-r", "-2"], [19, 20]),
        (["-r", "-2:head-1"], [19]),
        (["-r", ":3"], [1, 2, 3]),
        (["-r", "7"], [7]),
        (["-r", "30:"], []),
        (["--kind", "weight_committed"], [6, 9, 16, 20]),
        (["--kind", "cell_promoted", "--cell", "c1"], [14]),
        (["--since", "2026-11-29T10:00:22Z", "--until", "2026-11-29T10:00:24"], [18, 19]),
        (["-r", "1:10", "--kind", "engines_stamped"], [7, 10]),
    ],
)
def test_log_ranges_and_filters(built_url: str, args: list[str], seqs: list[int]):
    result = invoke("--db", built_url, "log", *args)
    assert result.exit_code == 0, result.output
    assert [int(line.split()[0]) for line in result.stdout.splitlines()] == seqs


def test_log_json_header_is_the_head_it_was_read_at(built_url: str):
    answer = json.loads(invoke("--db", built_url, "log", "-r", "-1", "-o", "json").stdout)
    assert answer["header"]["seq"] == 20 and answer["header"]["version"] == 4
    assert answer["header"]["head_hash"] == answer["events"][-1]["hash"]
    assert answer["range"] == {"first_seq": 20, "last_seq": 20}


def test_export_jsonl_is_lossless(built_url: str):
    result = invoke("--db", built_url, "export", "--format", "jsonl")
    with Ledger.open(built_url, readonly=True) as reader:
        expected = [event.to_dict() for event in reader.events(RUN_ID)]
    assert [json.loads(line) for line in result.stdout.splitlines()] == expected
    assert invoke("--db", built_url, "log", "-o", "jsonl").stdout == result.stdout


def test_show_version_zero_is_run_started_and_versions_are_commits(built_url: str):
    zero = json.loads(invoke("--db", built_url, "show", "0", "-o", "json").stdout)
    three = json.loads(invoke("--db", built_url, "show", "3", "-o", "json").stdout)
    assert zero["event"]["kind"] == "run_started"
    assert (three["event"]["kind"], three["event"]["version"], three["event"]["seq"]) == (
        "weight_committed", 3, 16,
    )


def test_lag_and_cells_follow_the_story(built_url: str):
    lag = json.loads(invoke("--db", built_url, "lag", "-o", "json").stdout)
    assert [(e["engine_id"], e["stamped_version"], e["lag"]) for e in lag["engines"]] == [
        ("e0", 3, 1), ("e1", 3, 1),
    ]
    assert lag["unstamped_versions"] == [4]
    cells = json.loads(invoke("--db", built_url, "cells", "-o", "json").stdout)
    assert [(c["cell_id"], c["state"], c["epochs"]) for c in cells["cells"]] == [
        ("c0", "errored", [1]), ("c1", "publisher", [2]),
    ]


def test_db_upgrade_creates_and_db_current_reports(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'fresh' / 'ledger.db'}"
    assert invoke("--db", url, "db", "current").exit_code == 2
    created = invoke("--db", url, "db", "upgrade", "-o", "json")
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["from"] is None
    # Revision 0006 (issue 22: the index over version_uses by seq) is the head now.
    assert invoke("--db", url, "db", "current").stdout == "0006 (head)\n"
    again = invoke("--db", url, "db", "upgrade")
    assert "already at 0006" in again.stdout


def test_plot_writes_a_png_with_the_staleness_histogram(built_url: str, sqlite_path: Path):
    metrics = sqlite_path.parent / "metrics.jsonl"
    metrics.write_text(
        json.dumps({"step": 1, "rollout/fully_async/staleness_hist": {"0": 3, "1": 1}}) + "\n"
        + "not json\n"
        + json.dumps({"step": 2, "rollout/fully_async/staleness_hist": {"1": 2, "2": 1}}) + "\n"
    )
    out = sqlite_path.parent / "plot.png"
    result = invoke("--db", built_url, "plot", "-o", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["histogram"] == {"0": 3, "1": 3, "2": 1}
    assert (answer["commits"], answer["promotions"], answer["aborted"]) == (4, 2, 1)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cli_imports_neither_matplotlib_nor_ray_nor_torch():
    code = (
        "import sys, ledger.cli.app, ledger.cli.query, ledger.cli.render; "
        "print(sorted(m for m in ('matplotlib', 'ray', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.postgres
def test_json_answers_on_postgresql(pg_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    with Ledger.open(pg_url) as writer:
        build_run(writer)
    status = invoke("--db", pg_url, "status", "-o", "json")
    assert status.exit_code == 0, status.output
    answer = json.loads(status.stdout)
    assert answer["backend"] == "postgresql"
    assert answer["header"] == {
        "run_id": RUN_ID, "seq": 20, "version": 4, "epoch": 2, "publisher_cell": "c1",
        "head_hash": answer["head_hash"],
    }
    log = json.loads(invoke("--db", pg_url, "log", "-o", "json").stdout)
    assert [e["seq"] for e in log["events"]] == list(range(1, 21))
    verify = invoke("--db", pg_url, "verify", "-o", "json")
    assert verify.exit_code == 0 and json.loads(verify.stdout)["notes"][0]["versions"] == [4]
    # Same events, same frozen clock, same keys: the same chain as on SQLite.
    assert log["events"][-1]["hash"] == answer["head_hash"]


# ---------------------------------------------------------------------- no argument list crashes


@pytest.fixture(scope="module")
def fuzz_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger.store.append, "_utcnow", frozen_clock())
        with Ledger.open(f"sqlite:///{base / 'ledger.db'}") as writer:
            build_run(writer)
    return f"sqlite:///{base / 'ledger.db'}", base


_TOKENS = [
    "runs", "status", "log", "show", "verify", "cells", "lag", "export", "plot", "db",
    "current", "-o", "--output", "--format", "-r", "--range", "--kind", "--cell", "--since",
    "--until", "--seq", "--all-runs", "--run", "--db", "--metrics", "-h", "table", "json",
    "jsonl", "csv", "xml", "0", "1", "3", "-1", "-3", "5:2", "head", "head-2", ":", "3:",
    "1:2:3", "99999999999999999999", "-99999999999999999999", "weight_committed", "c0",
    "run-a", "nope", "2026-11-29T10:00:05Z", "yesterday", "mysql://x/y", "sqlite://",
    "sqlite:///missing/ledger.db", "out.png", "metrics.jsonl", "",
]


_COMMANDS = [[], *([c] for c in _TOKENS[:9]), ["db"], ["db", "current"]]


@settings(
    max_examples=150, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    prefix=st.sampled_from(["good", "missing", "none"]),
    command=st.sampled_from(_COMMANDS),
    tokens=st.lists(st.one_of(st.sampled_from(_TOKENS), st.text(max_size=8)), max_size=6),
)
def test_no_argument_list_produces_a_traceback(
    fuzz_ledger, prefix: str, command: list[str], tokens: list[str]
):
    url, base = fuzz_ledger
    head = {"good": ["--db", url], "missing": ["--db", "sqlite:///nowhere/x.db"], "none": []}
    with contextlib.chdir(base):  # plot -o/-metrics and relative paths land here
        result = CliRunner().invoke(app, head[prefix] + command + tokens, env=ENV)
    assert result.exit_code in (0, 1, 2), (command, tokens, result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        command, tokens, repr(result.exception),
    )
    assert not (base / "nowhere").exists()
