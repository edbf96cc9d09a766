"""`orchestrator run`: bad input is one line on stderr and exit code 2, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
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
    import ray

    assert ray.is_initialized(), "a command stopped the Ray it found running"


def test_a_command_stops_the_ray_it_started_when_it_is_done():
    """Not at interpreter exit, where Ray first sleeps 0.5 s for worker logs the CLI never
    forwards. In a process of its own: this session's cluster must stay up."""
    script = ("import ray\n"
              "from orchestrator.cli import _ray_stopped_when_done\n"
              "with _ray_stopped_when_done():\n"
              "    ray.init(address='local', num_cpus=1, include_dashboard=False,\n"
              "             log_to_driver=False, configure_logging=False)\n"
              "    print('inside', ray.is_initialized())\n"
              "print('after', ray.is_initialized())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["inside", "True", "after", "False"]


def test_a_finished_run_id_is_not_silently_reused(capsys, tmp_path: Path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "ledger.db").write_bytes(b"")
    code, _, err = run_cli(["run", "--run-id", "taken", "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "already exists", "--resume")


def test_cells_without_a_group_per_step_are_exit_2_and_write_nothing(capsys, tmp_path: Path):
    code, _, err = run_cli(["run", "--num-cells", "3", "--rollout-batch-size", "2",
                            "--runs-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "rollout_batch_size", "3 cells")
    assert list(tmp_path.iterdir()) == []


def test_no_command_is_one_line_and_exit_2(capsys):
    code, _, err = run_cli([], capsys)
    assert_one_line_error(code, err, "Missing command")


def test_run_help_lists_every_run_config_field_with_its_help(capsys):
    from orchestrator.config import RunConfig

    main(["run", "--help"])  # returns: exit code 0

    text = " ".join(capsys.readouterr().out.split())
    for name, field in RunConfig.model_fields.items():
        flag = name.replace("_", "-")
        assert f"--{flag}" in text
        assert " ".join(field.description.split()) in text
    assert "--sync / --no-sync" in text
    assert "--async-unused-samples-handler <drop|retry>" in text
    for option in ("--config", "--resume", "--ray-address", "--runs-dir",
                   "--progress / --no-progress"):
        assert option in text


def test_config_file_then_flags_reach_the_job(capsys, tmp_path: Path, monkeypatch):
    from orchestrator.control import driver

    seen = []

    def fake_run_job(config, options):
        seen.append((config, options))
        raise driver.StartupError("stopped before the job")

    monkeypatch.setattr(driver, "run_job", fake_run_job)
    path = tmp_path / "run.yaml"
    path.write_text("num_cells: 3\nrollout_batch_size: 4\nmax-weight-staleness: null\n"
                    "sync: true\n")

    code, _, err = run_cli(["run", "--config", str(path), "--rollout-batch-size", "6",
                            "--no-sync", "--ray-address", "ray://head:10001",
                            "--runs-dir", str(tmp_path), "--no-progress"], capsys)

    assert_one_line_error(code, err, "stopped before the job")
    [(config, options)] = seen
    assert config.rollout_batch_size == 6 and config.sync is False  # flags win
    assert config.num_cells == 3 and config.max_weight_staleness is None  # from the file
    assert config.seed == 1234  # neither: the default
    assert options.ray_address == "ray://head:10001" and options.runs_dir == tmp_path
    assert options.progress is False and options.resume is False


def test_drill_usage_errors_are_one_line_and_exit_2(capsys):
    code, _, err = run_cli(["drill"], capsys)
    assert_one_line_error(code, err, "--scenario")

    code, _, err = run_cli(["drill", "--scenario", "all", "--repeat", "many"], capsys)
    assert_one_line_error(code, err, "--repeat")


_RESUME_PROBE = """
import sys, ray
from orchestrator.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exited:
    print("ray started" if ray.is_initialized() else "ray not started", exited.code)
"""


@pytest.mark.parametrize("with_db", [False, True])
def test_resuming_an_unknown_run_is_one_line_before_ray_starts_and_writes_nothing(
    tmp_path: Path, with_db: bool
):
    import os
    import subprocess
    import sys

    from ledger import Ledger

    runs = tmp_path / "runs"
    argv = ["run", "--resume", "--run-id", "nope", "--runs-dir", str(runs)]
    if with_db:  # a ledger that exists, holding another run only
        url = f"sqlite:///{tmp_path / 'shared.db'}"
        with Ledger.open(url) as ledger:
            ledger.start_run("another")
        argv += ["--db", url]
    done = subprocess.run([sys.executable, "-c", _RESUME_PROBE, *argv], capture_output=True,
                          text=True, env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"},
                          cwd=tmp_path, timeout=300)

    assert done.stdout.strip() == "ray not started 2", done.stdout + done.stderr
    assert_one_line_error(2, done.stderr, "run nope is not in", "nothing to resume")
    assert not (runs / "nope").exists()
    if with_db:
        with Ledger.open(url, readonly=True) as ledger:
            assert [run.run_id for run in ledger.runs()] == ["another"]
