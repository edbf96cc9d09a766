"""The driver's batch_trained events: each drop the rollout manager reports is recorded once."""

from __future__ import annotations

from ledger import EventKind, Ledger
from orchestrator.control.provenance_recorder import ProvenanceRecorder
from orchestrator.rollout.types import RolloutFnTrainOutput, Sample


def one_group_batch(group_index: int, version: int) -> RolloutFnTrainOutput:
    samples = [Sample(index=group_index * 2 + i, group_index=group_index, prompt_tokens=[3, 4],
                      response_tokens=[10, 1], rollout_log_probs=[-0.1, -0.2], reward=float(i),
                      weight_versions=[version], token_versions=[version, version])
               for i in range(2)]
    return RolloutFnTrainOutput(samples=[samples])


def test_each_drop_is_recorded_once_with_its_reason(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run("r")
        recorder = ProvenanceRecorder(ledger, "r")
        common = {"trainer_version": 0, "produced_version": None, "cells": ["cell-0"],
                  "drain_version": 0, "recycled": 0}

        first = recorder.record(1, one_group_batch(0, 0), dropped_prompts={5: "stale"},
                                next_index=8, **common)
        second = recorder.record(2, one_group_batch(1, 0),
                                 dropped_prompts={5: "stale", 7: "starved", 6: "stale"},
                                 next_index=9, **common)

        assert first.kind == EventKind.BATCH_TRAINED
        assert first.payload["prompts"]["dropped"] == {"stale": [5]}
        assert first.payload["prompts"]["trained"] == [0]
        assert second.payload["prompts"]["dropped"] == {"starved": [7], "stale": [6]}
        assert second.payload["prompts"]["next_index"] == 9
