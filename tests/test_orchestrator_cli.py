"""`orchestrator run`: bad input is one line on stderr and exit code 2, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("orchestrator: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["run", "--no-such-option"], ["--no-such-option"]),
        (["run", "--max-weight-staleness", "-1"], ["max_weight_staleness"]),
        (["run", "--backend", "tensorflow"], ["--backend"]),
        (["run", "--async-unused-samples-handler", "keep"], ["--async-unused-samples-handler"]),
        (["run", "--run-id", "../escape"], ["run_id"]),
        (["run", "--resume"], ["--resume needs --run-id"]),
        (["explode"], ["explode"]),
    ],
)
def test_bad_options_are_one_line_and_exit_2(argv, fragments, capsys, tmp_path: Path):
    code, _, err = run_cli([*argv[:1], *(["--runs-dir", str(tmp_path)] if argv[0] == "run" else []),
                            *argv[1:]], capsys)
    assert_one_line_error(code, err, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_unreadable_and_invalid_config_files_name_the_problem(capsys, tmp_path: Path):
    missing = tmp_path / "missing.yaml"
    code, _, err = run_cli(["run", "--config", str(missing), "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, str(missing))

    bad = tmp_path / "bad.yaml"
    bad.write_text("num_cells: 0\n")
    code, _, err = run_cli(["run", "--config", str(bad), "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "num_cells")

    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("warp_speed: 9\n")
    code, _, err = run_cli(["run", "--config", str(unknown), "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "warp_speed")


def test_unreachable_database_is_exit_2(capsys, tmp_path: Path):
    url = "postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2"
    code, _, err = run_cli(["run", "--db", url, "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "unavailable")


def test_unsupported_database_url_is_exit_2(capsys, tmp_path: Path):
    code, _, err = run_cli(["run", "--db", "mysql://root@localhost/x", "--runs-dir",
                            str(tmp_path)], capsys)
    assert_one_line_error(code, err, "unsupported database")


@pytest.mark.usefixtures("ray_cluster")
def test_more_actors_than_cpus_is_exit_2_and_writes_nothing(capsys, tmp_path: Path):
    code, _, err = run_cli(["run", "--num-cells", "30", "--num-engines", "30",
                            "--rollout-batch-size", "30", "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "30 cells and 30 engines need", "CPUs")
    assert list(tmp_path.iterdir()) == []


def test_a_finished_run_id_is_not_silently_reused(capsys, tmp_path: Path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "ledger.db").write_bytes(b"")
    code, _, err = run_cli(["run", "--run-id", "taken", "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "already exists", "--resume")
