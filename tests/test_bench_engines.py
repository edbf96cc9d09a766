"""The benchmarks' modelled-accelerator engine (``bench/_jobs.py``): every thread that
generates a group, in a batched call or a single one, runs on idle cycles only, so the modelled
device never takes a core from the trainer (what ``async_vs_sync --engines device`` measures)."""

from __future__ import annotations

import os

import pytest

from actors.policies.policy import PolicyConfig
from actors.task import TOKENIZER, AdditionTask
from bench._jobs import DeviceLatencyEngine
from orchestrator.rollout.types import GroupRequest

TASK = AdditionTask(seed=0)


class _RecordingEngine(DeviceLatencyEngine):
    device_s_per_token = 0.001

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policies: list[int] = []

    def _forward_step(self, tokens, decoder):
        self.policies.append(os.sched_getscheduler(0))  # this generating thread's policy
        return super()._forward_step(tokens, decoder)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_batched_calls_generating_threads_run_on_idle_cycles_only() -> None:
    engine = _RecordingEngine("engine-0", "torch", PolicyConfig(vocab_size=TOKENIZER.vocab_size),
                              seed=0, task=TASK)

    # Three groups: run on the batch's threads, never on this (the caller's) thread.
    engine.generate_batch([GroupRequest(TASK.make_prompt(g), 2, g) for g in range(3)])

    assert engine.policies and set(engine.policies) == {os.SCHED_IDLE}
