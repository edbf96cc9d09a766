"""Shared storage and the terminal event (issue 14, items 3 and 4): checkpoints at an absolute
path or an fsspec URL, written atomically and recorded as full URLs; a resume whose checkpoint
is unreadable fails with one line (exit 2) before anything is promoted; a run that fails ends
with ``run_failed`` (reason, last head) and one line (exit 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.cluster import checkpoint_io
from actors.policies.policy import PolicyConfig
from actors.task import TOKENIZER
from actors.train_cell import TrainCell
from ledger import EventKind, Ledger
from ledger.run_layout import RunLayout
from orchestrator.cli import main
from orchestrator.config import ConfigError, RunConfig
from orchestrator.control.placement.storage import CheckpointStore
from orchestrator.control.driver import JobOptions, run_job
from orchestrator.errors import StartupError, SupervisionLimitError

CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)


def test_a_location_is_an_absolute_path_or_a_url(tmp_path: Path) -> None:
    assert checkpoint_io.to_url(str(tmp_path / "a")) == f"file://{tmp_path}/a"
    assert checkpoint_io.to_url("s3://bucket/ckpt") == "s3://bucket/ckpt"
    with pytest.raises(checkpoint_io.StorageError, match="relative path"):
        checkpoint_io.to_url("runs/ckpt")
    with pytest.raises(ConfigError, match="checkpoint_dir: .*absolute path or an fsspec URL"):
        RunConfig.from_yaml(None, {"checkpoint_dir": "runs/ckpt"})
    assert RunConfig(checkpoint_dir="memory://ckpt").checkpoint_dir == "memory://ckpt"


@pytest.mark.parametrize("where", ["path", "file-url", "object-store"])
def test_an_atomic_write_leaves_the_object_and_no_temporary(tmp_path: Path, where: str) -> None:
    base = {"path": str(tmp_path / "ckpt"), "file-url": f"file://{tmp_path}/ckpt",
            "object-store": f"memory://rl14-{os.getpid()}/ckpt"}[where]
    url = checkpoint_io.join_url(base, "step-000002.pt")

    checkpoint_io.write_bytes_atomic(url, b"old")
    checkpoint_io.write_bytes_atomic(url, b"new")

    assert checkpoint_io.read_bytes(url) == b"new"
    assert checkpoint_io.list_names(base) == ["step-000002.pt"]  # no temporary left behind
    assert checkpoint_io.is_readable(url)
    assert not checkpoint_io.is_readable(checkpoint_io.join_url(base, "step-000004.pt"))


def test_the_default_checkpoint_dir_is_absolute_even_under_a_relative_runs_dir() -> None:
    store = CheckpointStore.of(RunConfig(run_id="r"), RunLayout.of(Path("runs"), "r"))

    assert store.url == f"file://{Path.cwd() / 'runs' / 'r' / 'checkpoints'}"
    assert store.checkpoint_url(10) == store.url + "/step-000010.pt"
    with pytest.raises(StartupError, match="not readable from the driver's node"):
        store.require_readable(store.checkpoint_url(10))


def test_a_cell_checkpoint_round_trips_through_an_object_store_url() -> None:
    url = f"memory://rl14-{os.getpid()}/cells/step-000001.pt"
    saved = TrainCell("cell-0", "torch", CONFIG, 0)
    restored = TrainCell("cell-1", "torch", CONFIG, 7)

    summary = saved.save_checkpoint(url)
    assert restored.checkpoint_readable(url)
    assert restored.load_checkpoint(url)["path"] == summary["path"] == url
    assert restored.weights_checksum() == saved.weights_checksum()
    assert not restored.checkpoint_readable(url.replace("000001", "000009"))


def _config(run_id: str, **fields) -> RunConfig:
    return RunConfig(run_id=run_id, num_rollout=3, rollout_batch_size=4, n_samples_per_prompt=4,
                     save_interval=2, heartbeat_timeout_s=5.0, **fields)


@pytest.mark.ray
def test_a_resume_from_an_unreadable_checkpoint_fails_before_anything_is_promoted(
        ray_cluster, tmp_path: Path, capsys) -> None:
    shared = tmp_path / "shared"
    result = run_job(_config("unreadable", checkpoint_dir=f"file://{shared}"),
                     JobOptions(runs_dir=tmp_path, progress=False, plot=False))
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        saved = [e for e in ledger.events("unreadable") if e.kind == EventKind.CHECKPOINT_SAVED]
    assert [e.payload["path"] for e in saved] == [f"file://{shared}/step-000002.pt"]
    (shared / "step-000002.pt").unlink()  # e.g. a directory only the old machine had

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--resume", "--run-id", "unreadable", "--runs-dir", str(tmp_path),
              "--num-rollout", "3", "--no-progress"])

    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2
    assert err[-1].startswith("orchestrator: error: checkpoint file://")
    assert "not readable" in err[-1] and "Traceback" not in "\n".join(err)
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        promotions = [e.payload["reason"] for e in ledger.events("unreadable")
                      if e.kind == EventKind.CELL_PROMOTED]
    assert promotions == ["start"]  # nothing promoted for the resume


class _PlantedLimit:
    """An on_step hook that ends the run the way an exhausted restart budget does."""

    def __call__(self, job, step: int) -> None:
        if step == 1:
            raise SupervisionLimitError("replacing the rollout manager: more than 10 "
                                        "replacements in 600s; giving up")


@pytest.mark.ray
def test_a_run_that_fails_ends_with_run_failed_in_the_ledger(ray_cluster, tmp_path: Path) -> None:
    with pytest.raises(SupervisionLimitError):
        run_job(_config("fails"), JobOptions(runs_dir=tmp_path, progress=False, plot=False,
                                             on_step=_PlantedLimit()))

    with Ledger.open(f"sqlite:///{tmp_path}/fails/ledger.db", readonly=True) as ledger:
        events = list(ledger.events("fails"))
        head = ledger.head("fails")
    failed = [e for e in events if e.kind == EventKind.RUN_FAILED]
    assert len(failed) == 1
    assert failed[0].payload["reason"].startswith("SupervisionLimitError: replacing the rollout")
    assert failed[0].payload["head_version"] == head.version >= 2
    assert not any(e.kind == EventKind.RUN_FINISHED for e in events)


def test_a_failed_run_is_one_line_and_exit_1(monkeypatch, capsys) -> None:
    def fail(config, options):
        raise SupervisionLimitError("healing cell cell-1: more than 10 replacements in 600s; "
                                    "giving up")

    monkeypatch.setattr("orchestrator.control.driver.run_job", fail)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--no-progress"])

    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "orchestrator: run failed: healing cell cell-1: more than 10 replacements in 600s; "
        "giving up\n")
