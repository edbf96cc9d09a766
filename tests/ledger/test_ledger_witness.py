"""Witnesses against rollback: a consistent rollback (events cut, head row rolled back to match,
as restoring an older backup does) verifies clean on its own; the witnesses a run's files
recorded catch it, on SQLite and PostgreSQL, through the API and `ledger verify --witness`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ledger.store.append
from ledger import Ledger, Witness, check_witness, read_witnesses
from ledger.cli.app import app
from ledger.run_layout import LEDGER_HEAD_KEY, WITNESS_KEYS, RunLayout
from ledger.audit.witness import (
    BEHIND,
    DIVERGED,
    read_checkpoint_witness,
    write_checkpoint_witness,
)
from tests.cli_scenario import RUN_ID, build_run, frozen_clock
from tests.ledger_helpers import execute

ENV = {"COLUMNS": "200", "LEDGER_DB": None}
# The scenario's steps end at these seqs (stamp of v1, v2, v3; commit of v4); the checkpoint
# after step 3 is seq 18.
STEP_HEADS = {1: 7, 2: 10, 3: 17, 4: 20}
CHECKPOINT_SEQ = 18


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def _witness_at(reader: Ledger, seq: int) -> Witness:
    """The head a file would have recorded right after event ``seq``."""
    events = list(reader.events(RUN_ID, 1, seq))
    version = max((e.version for e in events if e.version is not None), default=0)
    return Witness(RUN_ID, seq, version, events[-1].hash)


def write_run_files(reader: Ledger, run_dir: Path) -> RunLayout:
    """metrics.jsonl (one line per step, each with its ledger head) and a checkpoint with its
    witness, as `orchestrator run` writes them."""
    layout = RunLayout(run_dir)
    layout.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    with layout.metrics_path.open("w") as sink:
        for step, seq in STEP_HEADS.items():
            record = {"step": step, "reward/mean": 0.1 * step,
                      LEDGER_HEAD_KEY: _witness_at(reader, seq).to_dict()}
            sink.write(json.dumps(record) + "\n")
        sink.write('{"step": 5, "reward/mean": 0.5, "ledger_he')  # cut short by a crash
    layout.checkpoint_path(3).write_bytes(b"weights")
    write_checkpoint_witness(layout.checkpoint_path(3), _witness_at(reader, CHECKPOINT_SEQ))
    return layout


@pytest.fixture
def run_dir(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    directory = tmp_path / RUN_ID
    with Ledger.open(ledger_url) as writer:
        build_run(writer)
        write_run_files(writer, directory)
    return directory


def roll_back_to(url: str, seq: int) -> None:
    """What restoring an older backup does: later events gone, head row consistent with them."""
    as_hex = "lower(hex(hash))" if url.startswith("sqlite") else "encode(hash, 'hex')"
    execute(
        url,
        f"DELETE FROM ledger_events WHERE run_id = '{RUN_ID}' AND seq > {seq}",
        "UPDATE run_heads SET last_seq = :seq, head_version = 3, epoch = 2, "
        f"publisher_cell = 'c1', head_hash = (SELECT {as_hex} FROM ledger_events "
        f"WHERE run_id = '{RUN_ID}' AND seq = :seq) WHERE run_id = '{RUN_ID}'",
        seq=seq,
    )


def test_witnesses_of_a_healthy_run_hold(ledger_url: str, run_dir: Path):
    result = invoke("--db", ledger_url, "verify", "--witness", str(run_dir))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "ok: 1 run, 20 events, 5 witnesses checked, no problems"
    )
    with Ledger.open(ledger_url, readonly=True) as reader:
        assert reader.check_witnesses(read_witnesses(run_dir)) == []
        assert reader.witness(RUN_ID) == _witness_at(reader, 20)


def test_a_consistent_rollback_is_clean_alone_and_caught_by_witnesses(
    ledger_url: str, run_dir: Path
):
    roll_back_to(ledger_url, 16)

    alone = invoke("--db", ledger_url, "verify")
    witnessed = invoke("--db", ledger_url, "verify", "--witness", str(run_dir))

    assert alone.exit_code == 0, alone.output  # internally consistent: invisible on its own
    assert witnessed.exit_code == 1
    problems = [line for line in witnessed.stdout.splitlines() if line.startswith("run ")]
    assert [line.split(": ")[0:2] for line in problems] == [
        [f"run {RUN_ID} seq 17", BEHIND], [f"run {RUN_ID} seq 18", BEHIND],
        [f"run {RUN_ID} seq 20", BEHIND],
    ]
    assert "metrics.jsonl:4 saw seq 20 (version 4" in witnessed.stdout
    assert "step-000003.witness.json saw seq 18 (version 3" in witnessed.stdout
    with Ledger.open(ledger_url, readonly=True) as reader:
        checkpoint = read_checkpoint_witness(RunLayout(run_dir).checkpoint_path(3))
        assert checkpoint is not None
        assert [p.check for p in check_witness(reader, checkpoint)] == [BEHIND]
        assert sorted(p.seq for p in reader.check_witnesses(read_witnesses(run_dir))) == [
            17, 18, 20,
        ]


def test_a_rollback_that_was_written_on_diverges(ledger_url: str, run_dir: Path):
    roll_back_to(ledger_url, 16)
    with Ledger.open(ledger_url) as writer:  # a resume on the restored backup writes on
        writer.append(RUN_ID, "engines_stamped", {"version": 3, "engine_ids": ["e0"]},
                      cell_id="c1", epoch=2, idempotency_key="restamp:3")
        for step in (4, 5, 6):
            writer.commit_weights(RUN_ID, cell_id="c1", epoch=2, train_step=step,
                                  idempotency_key=f"again:{step}")

    result = invoke("--db", ledger_url, "verify", "--witness", str(run_dir), "-o", "json")

    assert result.exit_code == 1
    named = [(p["seq"], p["check"]) for p in json.loads(result.stdout)["problems"]]
    assert named == [(17, DIVERGED), (18, DIVERGED), (20, DIVERGED)]


@pytest.mark.parametrize("target", ["checkpoint", "sidecar", "metrics", "checkpoints dir"])
def test_witness_paths_may_name_one_file(ledger_url: str, run_dir: Path, target: str):
    layout = RunLayout(run_dir)
    path = {
        "checkpoint": layout.checkpoint_path(3), "sidecar": layout.witness_path(3),
        "metrics": layout.metrics_path, "checkpoints dir": layout.checkpoint_dir,
    }[target]
    expected = 4 if target == "metrics" else 1
    roll_back_to(ledger_url, 16)

    result = invoke("--db", ledger_url, "verify", "--witness", str(path), "-o", "json")

    answer = json.loads(result.stdout)
    assert result.exit_code == 1 and answer["witnesses_checked"] == expected
    assert all(p["check"] == BEHIND for p in answer["problems"])


def test_verify_finds_the_ledger_in_the_run_directory(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(ledger.store.append, "_utcnow", frozen_clock())
    directory = tmp_path / RUN_ID
    layout = RunLayout(directory)
    with Ledger.open(layout.ledger_url) as writer:
        build_run(writer)
        write_run_files(writer, directory)
    monkeypatch.chdir(tmp_path)

    result = invoke("verify", "--witness", RUN_ID)

    assert result.exit_code == 0, result.output
    assert "5 witnesses checked" in result.stdout


def test_witness_of_a_run_the_ledger_never_heard_of(ledger_url: str, run_dir: Path):
    stranger = run_dir / "checkpoints" / "step-000009.witness.json"
    stranger.write_text(json.dumps({"run_id": "run-z", "seq": 4, "version": 1, "hash": "a" * 64}))
    result = invoke("--db", ledger_url, "verify", "--witness", str(stranger))
    assert result.exit_code == 1
    assert f"run run-z seq 4: {BEHIND}: " in result.stdout
    assert "the ledger has no run run-z" in result.stdout


@pytest.mark.parametrize(
    "content, fragment",
    [("{not json", "not a witness file"), ('{"run_id": "r", "seq": 1}', "needs the keys"),
     ('{"run_id": "r", "seq": -1, "version": 0, "hash": "x"}', "malformed witness")],
)
def test_a_bad_witness_file_is_a_one_line_error(
    ledger_url: str, run_dir: Path, content: str, fragment: str
):
    sidecar = RunLayout(run_dir).witness_path(3)
    sidecar.write_text(content)
    result = invoke("--db", ledger_url, "verify", "--witness", str(run_dir))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("ledger: error: ") and fragment in result.stderr
    assert str(sidecar) in result.stderr


def test_no_witness_at_the_path_is_a_one_line_error(ledger_url: str, run_dir: Path, tmp_path):
    for path, fragment in [(tmp_path / "nowhere", "no run directory"),
                           (tmp_path / "empty.jsonl", "no witnesses in"),
                           (RunLayout(run_dir).checkpoint_path(7), "has no witness")]:
        if path.suffix == ".jsonl":
            path.write_text('{"step": 1}\n')
        result = invoke("--db", ledger_url, "verify", "--witness", str(path))
        assert result.exit_code == 2, (path, result.output)
        assert fragment in result.stderr


def test_witness_files_round_trip(tmp_path: Path):
    witness = Witness(RUN_ID, 12, 3, "b" * 64)
    written = write_checkpoint_witness(tmp_path / "step-000012.pt", witness)
    assert written.name == "step-000012.witness.json"
    assert tuple(json.loads(written.read_text())) == tuple(sorted(WITNESS_KEYS))
    read = read_checkpoint_witness(tmp_path / "step-000012.pt")
    assert read is not None and read.to_dict() == witness.to_dict()
    assert read_checkpoint_witness(tmp_path / "step-000099.pt") is None
