"""--tracker: every metrics.jsonl key per step, the run's identity and ledger events as markers,
read back from the TensorBoard event files and the W&B offline run directory."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.errors import StartupError
from orchestrator.control.reporting.tracking import RunTracker, open_tracker

RECORDS = [
    {"step": 1, "time": "2026-01-01T00:00:00", "reward/mean": 0.25, "publisher": "cell-0",
     "published_version": None, "train/loss": -0.5, "ledger_head": {"version": 1, "seq": 7}},
    {"step": 2, "time": "2026-01-01T00:00:01", "reward/mean": 0.5, "publisher": "cell-1",
     "published_version": 2, "train/loss": -0.25, "ledger_head": {"version": 2, "seq": 12}},
]


def _read_tensorboard(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def _texts(accumulator: Any, tag: str) -> list[tuple[int, str]]:
    return [(event.step, event.tensor_proto.string_val[0].decode())
            for event in accumulator.Tensors(f"{tag}/text_summary")]


def _read_wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of an offline ``run-<id>.wandb`` file (LevelDB log framing: 32 KiB
    blocks of ``crc32 | length | type`` chunks after a 7-byte ``:W&B`` header)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending, records = 7, 32768, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if left < 7 or kind == 0:
            position += left
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _fill(tracker: RunTracker, ledger_url: str) -> None:
    """A run as the driver drives a tracker: start, two steps, a failover, the end."""
    ledger = Ledger.open(ledger_url)
    ledger.start_run("tracked", config={"seed": 1})
    ledger.promote("tracked", "cell-0", reason="start")
    config = RunConfig(run_id="tracked", db="postgresql+psycopg://u:hunter2@db/x")
    tracker.start(config, "tracked", ledger.head("tracked"))
    tracker.log_step(1, RECORDS[0])
    tracker.log_ledger_events(ledger.events("tracked", start_seq=tracker.next_seq), 1)
    ledger.promote("tracked", "cell-1", reason="failover")
    tracker.log_step(2, RECORDS[1])
    tracker.log_ledger_events(ledger.events("tracked", start_seq=tracker.next_seq), 2)
    tracker.finish(ledger, "tracked", 2)
    ledger.close()


def test_tensorboard_event_files_hold_every_key_the_run_and_the_markers(tmp_path: Path,
                                                                        sqlite_url: str) -> None:
    pytest.importorskip("tensorboard")
    config = RunConfig(run_id="tracked", tracker=["tensorboard"])
    tracker = open_tracker(config, tmp_path)
    _fill(tracker, sqlite_url)

    events = _read_tensorboard(tmp_path / "tensorboard")
    scalars = set(events.Tags()["scalars"])
    for record in RECORDS:
        for key, value in record.items():
            if isinstance(value, float | int):
                assert key in scalars, key
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("ledger_head/version")] == [(1, 1), (2, 2)]
    assert [e.step for e in events.Scalars("published_version")] == [2]  # None is not a number
    assert _texts(events, "publisher") == [(1, "cell-0"), (2, "cell-1")]  # logged on change
    config_text = _texts(events, "run/config")[0][1]
    assert '"run_id": "tracked"' in config_text and "hunter2" not in config_text
    assert "run id `tracked`; ledger head: version 0, epoch 1" in _texts(events, "run/ledger")[0][1]
    promotions = _texts(events, "ledger/cell_promoted")
    assert [step for step, _ in promotions] == [1, 2]
    assert '"reason": "failover"' in promotions[1][1] and "cell=cell-1 epoch=2" in promotions[1][1]
    assert [(e.step, e.value) for e in events.Scalars("ledger/promotions")] == [(1, 1), (2, 2)]
    assert "version 0, epoch 2, publisher cell-1" in _texts(events, "run/ledger_head")[0][1]


def test_wandb_offline_run_holds_history_config_and_markers(tmp_path: Path, sqlite_url: str,
                                                            monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default
    config = RunConfig(run_id="tracked", tracker=["wandb"],
                       db="postgresql+psycopg://u:hunter2@db/x")
    tracker = open_tracker(config, tmp_path)
    _fill(tracker, sqlite_url)

    run_files = list((tmp_path / "wandb").glob("offline-run-*-tracked/run-tracked.wandb"))
    assert len(run_files) == 1, list((tmp_path / "wandb").iterdir())
    records = _read_wandb_records(run_files[0])
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_id == "tracked" and run.project == "rl-ledger"
    config_items = {item.key: item.value_json for item in run.config.update}
    assert json.loads(config_items["run_id"]) == "tracked"
    assert "hunter2" not in config_items["db"]
    history = [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    steps = {int(row["_step"]): row for row in history}
    assert json.loads(steps[1]["reward/mean"]) == 0.25
    assert json.loads(steps[2]["reward/mean"]) == 0.5
    assert json.loads(steps[2]["ledger_head/version"]) == 2
    summaries = [item for r in records if r.WhichOneof("record_type") == "summary"
                 for item in r.summary.update]
    markers = [json.loads(i.value_json) for i in summaries if i.key == "ledger/cell_promoted"]
    assert any('"reason": "failover"' in text for text in markers)


def test_no_tracker_is_a_no_op_and_a_missing_package_is_a_startup_error(tmp_path: Path,
                                                                         monkeypatch) -> None:
    tracker = open_tracker(RunConfig(), tmp_path)
    assert tracker.backends == []
    tracker.log_step(1, RECORDS[0])
    tracker.close()
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    with pytest.raises(StartupError, match=r"pip install -e '\.\[tracking\]'"):
        open_tracker(RunConfig(tracker=["tensorboard"]), tmp_path)


def test_a_failing_backend_is_dropped_and_never_fails_the_run() -> None:
    class Broken:
        name = "broken"

        def scalars(self, step: int, values: dict[str, float]) -> None:
            raise OSError("disk full")

        def text(self, step: int, tag: str, text: str) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            raise AssertionError("a dropped backend is not closed")

    tracker = RunTracker([Broken()])
    tracker.log_step(1, RECORDS[0])
    assert tracker.backends == []
    tracker.close()
