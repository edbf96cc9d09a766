"""One line of ``metrics.jsonl`` per training step, and the rewards a run summary needs."""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ledger import Head
from ledger.run_layout import LEDGER_HEAD_KEY
from orchestrator.metric_keys import REWARD_KEY, WEIGHT_VERSION_KEY
from ledger.audit.witness import Witness
from orchestrator.control.reporting.tracking import RunTracker
from orchestrator.rollout.step_metrics import train_staleness_metrics
from orchestrator.rollout.types import RolloutFnTrainOutput

__all__ = ["StepRecorder"]


class StepRecorder:
    """Builds each step's record and appends it to ``metrics.jsonl``. Every line carries the
    ledger head it saw (a witness: ``ledger verify --witness`` and ``--resume`` compare it with
    the ledger, so a database restored from an older backup is caught)."""

    def __init__(self, metrics_path: Path, run_id: str, tracker: RunTracker | None = None) -> None:
        self.metrics_path = metrics_path
        self.tracker = tracker  # TensorBoard / W&B: each record is logged there too
        self.run_id = run_id
        self.rewards: list[float] = []
        self._started = time.monotonic()

    def record(self, step: int, batch: RolloutFnTrainOutput, train: dict[str, float],
               head: Head, *, trainer_version: int, published_version: int | None,
               cells_alive: int, quorum_id: int, step_s: float, timings: dict[str, float],
               negative_staleness_total: int) -> dict[str, Any]:
        """The record of 0-based ``step``, written to the metrics file; returns it.
        ``trainer_version``: the version of the weights the batch trained on (the train-time
        staleness is measured from it). ``step_s``: the step's wall seconds, the same that
        ``timings`` was derived from (so ``time/control_plane_s`` is exactly the step less its
        compute phases)."""
        rewards = [sample.reward for group in batch.samples for sample in group]
        reward_mean = statistics.fmean(rewards) if rewards else 0.0
        self.rewards.append(reward_mean)
        record: dict[str, Any] = {
            "step": step + 1,
            "time": datetime.now(UTC).isoformat(),
            "wall_s": round(time.monotonic() - self._started, 3),
            "step_s": round(step_s, 4),
            "samples": len(rewards),
            "samples_per_s": round(len(rewards) / step_s, 2) if step_s > 0 else None,
            REWARD_KEY: reward_mean,
            WEIGHT_VERSION_KEY: head.version,
            "published_version": published_version,
            "epoch": head.epoch,
            "publisher": head.publisher_cell,
            "cells_alive": cells_alive,
            "quorum_id": quorum_id,
        }
        record.update({f"train/{key}": value for key, value in train.items()})
        record.update(batch.metrics)
        record.update(train_staleness_metrics(batch.samples, trainer_version))
        record["negative_staleness_run_total"] = negative_staleness_total
        record.update({key: round(value, 4) for key, value in timings.items()})
        record[LEDGER_HEAD_KEY] = Witness.of_head(self.run_id, head).to_dict()
        with self.metrics_path.open("a", encoding="utf-8") as sink:
            sink.write(json.dumps(record, default=str) + "\n")
        if self.tracker is not None:
            self.tracker.log_step(step + 1, record)
        return record

    def reward_window(self) -> tuple[float, float]:
        """Mean reward of the first and of the last few steps (up to 5, a quarter of the run)."""
        if not self.rewards:
            return 0.0, 0.0
        window = max(1, min(5, len(self.rewards) // 4 or 1))
        return (statistics.fmean(self.rewards[:window]),
                statistics.fmean(self.rewards[-window:]))

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self._started
