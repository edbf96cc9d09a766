"""The main job and the audit of issue 13: no credential in anything the job writes or prints,
and a resume refused on a ledger rolled back behind what the run's witnesses saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ledger import EventKind, Ledger, fold
from ledger.run_layout import default_ledger_url
from orchestrator.cli import main
from tests.ledger_helpers import dump_tables, execute

pytestmark = pytest.mark.usefixtures("ray_cluster")

PASSWORD = "S3cret-pw-4711"
SMALL_JOB = ["--num-rollout", "4", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--save-interval", "2", "--no-progress"]


def _run(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stopped:
        main(["run", *SMALL_JOB, *args])
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(stopped.value.code or 0), captured.out + captured.err


@pytest.mark.postgres
def test_a_password_in_the_database_url_is_never_recorded_or_printed(pg_url, tmp_path,
                                                                      capsys):
    url = pg_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    assert PASSWORD in url  # the server trusts the connection; the password is only carried

    code, output = _run(capsys, "--db", url, "--run-id", "secret", "--runs-dir", str(tmp_path))

    assert code == 0, output
    assert "***" in output  # the URL was shown, redacted
    assert PASSWORD not in output
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    with Ledger.open(pg_url, readonly=True) as ledger:
        assert PASSWORD not in repr(dump_tables(ledger))


def _roll_back(url: str, run_id: str, keep_seq: int) -> None:
    """What restoring an older backup does: the newest events are gone and the head row
    matches what is left (a consistent rollback the hash chain cannot see)."""
    with Ledger.open(url, readonly=True) as ledger:
        state = fold(run_id, (e for e in ledger.events(run_id) if e.seq <= keep_seq))
    execute(url,
            "DELETE FROM ledger_events WHERE run_id = :run AND seq > :keep",
            "UPDATE run_heads SET last_seq = :keep, head_version = :version, epoch = :epoch, "
            "publisher_cell = :publisher, head_hash = :hash WHERE run_id = :run",
            run=run_id, keep=keep_seq, version=state.head_version, epoch=state.epoch,
            publisher=state.publisher_cell, hash=state.head_hash)


def test_resume_refuses_a_ledger_behind_the_runs_witnesses(tmp_path: Path, capsys):
    code, output = _run(capsys, "--run-id", "rolled", "--runs-dir", str(tmp_path))
    assert code == 0, output
    url = default_ledger_url(tmp_path / "rolled")
    with Ledger.open(url, readonly=True) as ledger:
        events = list(ledger.events("rolled"))
        assert ledger.verify("rolled").ok
    checkpoint = next(e for e in events if e.kind == EventKind.CHECKPOINT_SAVED)
    _roll_back(url, "rolled", keep_seq=checkpoint.seq - 1)
    with Ledger.open(url, readonly=True) as ledger:
        rolled_back = dump_tables(ledger)

    code, output = _run(capsys, "--run-id", "rolled", "--runs-dir", str(tmp_path), "--resume")

    assert code == 2
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("orchestrator: error: refusing to resume")
    assert "Traceback" not in output
    with Ledger.open(url, readonly=True) as ledger:
        assert dump_tables(ledger) == rolled_back  # nothing written


def test_metrics_lines_and_checkpoints_carry_the_ledger_head_they_saw(tmp_path: Path, capsys):
    code, output = _run(capsys, "--run-id", "witnessed", "--runs-dir", str(tmp_path))
    assert code == 0, output
    run_dir = tmp_path / "witnessed"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    with Ledger.open(default_ledger_url(run_dir), readonly=True) as ledger:
        hashes = {e.seq: e.hash for e in ledger.events("witnessed")}
    for line in lines:
        witness = line["ledger_head"]
        assert witness["run_id"] == "witnessed"
        assert hashes[witness["seq"]] == witness["hash"]
    sidecars = sorted((run_dir / "checkpoints").glob("*.witness.json"))
    assert sidecars, "no checkpoint witness"
    for sidecar in sidecars:
        witness = json.loads(sidecar.read_text())
        assert hashes[witness["seq"]] == witness["hash"]
