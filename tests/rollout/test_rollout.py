"""FullyAsyncRolloutFn: producer bounds, recycling through the engines, drain failures."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orchestrator.metric_keys import FULLY_ASYNC_PREFIX
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from orchestrator.rollout.errors import ProducerDiedError
from orchestrator.rollout.producer import FullyAsyncRolloutFn
from orchestrator.rollout.types import EnginePool, RolloutFnTrainInput, SampleStatus
from tests.fake_engines import FakeEnginePool, make_prompt, run_async, settle
from tests.waiting import wait_until_async

M = FULLY_ASYNC_PREFIX


def make_rollout(
    pool: FakeEnginePool,
    *,
    batch: int = 4,
    capacity: int = 8,
    concurrency: int = 4,
    n_samples: int = 2,
    stall_warning_s: float = 30.0,
    **buffer_options,
) -> FullyAsyncRolloutFn:
    return FullyAsyncRolloutFn(
        pool,
        PromptSource(make_prompt),
        DataBuffer(capacity, **buffer_options),
        rollout_batch_size=batch,
        n_samples_per_prompt=n_samples,
        max_concurrent_groups=concurrency,
        stall_warning_s=stall_warning_s,
    )


def train_input(rollout_id: int = 0, version: int = 0) -> RolloutFnTrainInput:
    return RolloutFnTrainInput(rollout_id=rollout_id, weight_version=version)


def test_fake_pool_satisfies_the_protocol():
    assert isinstance(FakeEnginePool(), EnginePool)


def test_drained_batch_is_sorted_by_group_index_with_metrics():
    pool = FakeEnginePool(version=3, gated=True)
    rollout = make_rollout(pool, batch=4, concurrency=4)

    async def scenario():
        drain = asyncio.create_task(rollout.drain(train_input(version=5), lambda _at_least: 5))
        await settle()
        for index in reversed(pool.waiting()):  # finish in reverse order
            pool.release(index)
            await settle()
        output = await drain
        await rollout.stop()
        return output

    output = run_async(scenario)

    assert [group[0].group_index for group in output.samples] == [0, 1, 2, 3]
    assert all(len(group) == 2 for group in output.samples)
    assert output.metrics[M + "staleness_avg"] == 2.0
    assert output.metrics[M + "staleness_max"] == 2
    assert output.metrics[M + "staleness_hist"] == {2: 4}
    assert output.metrics[M + "trained"] == 4
    assert output.metrics[M + "negative_staleness_total"] == 0
    assert rollout.buffer.accounting().trained == 4


def test_aborted_group_is_regenerated_from_scratch_with_its_recycle_count():
    pool = FakeEnginePool(version=0)
    pool.abort.add(0)
    rollout = make_rollout(pool, batch=4, concurrency=1)

    async def scenario():
        await settle(5)
        pool.version = 1  # the weight update that aborted the request
        output = await rollout.drain(train_input(version=1), lambda _at_least: 1)
        await rollout.stop()
        return output

    output = run_async(scenario)

    assert pool.calls.count(0) == 2
    regenerated = output.samples[0]
    assert regenerated[0].group_index == 0
    assert all(s.status is SampleStatus.COMPLETED for s in regenerated)
    assert all(s.weight_versions == [1] for s in regenerated)  # old stamps are gone
    assert all(s.recycle_count == 1 for s in regenerated)
    assert output.metrics[M + "aborted_filtered"] == 1
    assert output.metrics[M + "recycled"] == 1


def test_full_buffer_blocks_the_producer():
    pool = FakeEnginePool()
    rollout = make_rollout(pool, batch=1, capacity=2, concurrency=2)

    async def scenario():
        rollout.start()
        await settle(50)
        calls_when_full = len(pool.calls)
        await settle(50)
        calls_later = len(pool.calls)
        await rollout.drain(train_input(), lambda _at_least: 0)
        await settle(50)
        calls_after_drain = len(pool.calls)
        await rollout.stop()
        return calls_when_full, calls_later, calls_after_drain

    calls_when_full, calls_later, calls_after_drain = run_async(scenario)

    # 2 buffered + 2 finished and waiting for room; nothing more until a drain makes room.
    assert calls_when_full == calls_later == 4
    assert calls_after_drain == 5
    assert rollout.buffer.queue_size == 2


def test_in_flight_groups_never_exceed_the_bound():
    pool = FakeEnginePool(gated=True)
    rollout = make_rollout(pool, batch=6, capacity=16, concurrency=3)

    async def scenario():
        drain = asyncio.create_task(rollout.drain(train_input(), lambda _at_least: 0))
        observed = []
        while not drain.done():
            await settle()
            observed.append(len(pool.waiting()))
            if pool.waiting():
                pool.release(pool.waiting()[0])
        await drain
        await rollout.stop()
        return observed

    observed = run_async(scenario)

    assert max(observed) == 3
    assert pool.peak_in_flight == 3
    assert rollout.peak_in_flight == 3


def test_producer_failure_beats_queued_groups():
    pool = FakeEnginePool()
    pool.fail.add(5)
    rollout = make_rollout(pool, batch=2, capacity=16, concurrency=2)

    async def scenario():
        rollout.start()
        await settle(50)
        queued = rollout.buffer.queue_size
        with pytest.raises(ProducerDiedError, match="RuntimeError: engine crashed on prompt 5"):
            await rollout.drain(train_input(), lambda _at_least: 0)
        return queued

    queued = run_async(scenario)

    assert queued >= 2  # enough for a batch, yet the drain failed
    assert rollout.buffer.queue_size == queued  # nothing claimed was lost
    assert isinstance(rollout.producer_error, RuntimeError)
    states = rollout.buffer.prompt_states()
    assert states[5] == "pending"  # the failed prompt went back, not missing
    assert rollout.buffer.accounting().balanced


def test_producer_death_fails_a_waiting_drain_at_once_and_releases_its_groups():
    pool = FakeEnginePool(gated=True)
    rollout = make_rollout(pool, batch=3, capacity=8, concurrency=2)

    async def scenario():
        drain = asyncio.create_task(rollout.drain(train_input(), lambda _at_least: 0))
        await settle()
        pool.release(0)
        await settle()
        pool.fail.add(1)
        pool.release(1)
        with pytest.raises(ProducerDiedError):
            await asyncio.wait_for(drain, 1.0)

    run_async(scenario)

    accounting = rollout.buffer.accounting()
    assert accounting.claimed == 0 and accounting.buffered == 1  # group 0 went back
    assert accounting.balanced


def test_a_drain_without_progress_warns_and_keeps_waiting(caplog):
    pool = FakeEnginePool(gated=True)
    rollout = make_rollout(pool, batch=1, concurrency=1, stall_warning_s=0.02)

    async def scenario():
        drain = asyncio.create_task(rollout.drain(train_input(rollout_id=7), lambda _a: 0))
        await wait_until_async(lambda: any("rollout 7: no group" in r.getMessage()
                                           for r in caplog.records),
                               what="the stalled drain's warning")
        assert not drain.done()  # it warned and kept waiting
        pool.release_all()
        output = await drain
        await rollout.stop()
        return output

    with caplog.at_level(logging.WARNING, logger="orchestrator.rollout.producer"):
        output = run_async(scenario)

    assert len(output.samples) == 1
    assert any("rollout 7: no group" in r.getMessage() for r in caplog.records)


def test_stop_returns_in_flight_prompts_and_later_drains_fail():
    pool = FakeEnginePool(gated=True)
    rollout = make_rollout(pool, batch=2, concurrency=3)

    async def scenario():
        rollout.start()
        await settle()
        await rollout.stop()
        await rollout.stop()  # idempotent
        with pytest.raises(ProducerDiedError, match="stopped"):
            await rollout.drain(train_input(), lambda _at_least: 0)

    run_async(scenario)

    accounting = rollout.buffer.accounting()
    assert (accounting.entered, accounting.in_flight, accounting.pending) == (3, 0, 3)
    assert accounting.balanced


def test_always_stale_prompt_goes_through_the_engines_max_recycles_times_then_starves():
    pool = FakeEnginePool(version=5)
    pool.stamp[0] = 0  # an engine that never gets new weights for this prompt
    rollout = make_rollout(pool, batch=2, concurrency=1, max_weight_staleness=2, max_recycles=3)

    async def scenario():
        outputs = [await rollout.drain(train_input(i, 5), lambda _at_least: 5) for i in range(4)]
        await rollout.stop()
        return outputs

    outputs = run_async(scenario)

    assert pool.calls.count(0) == 4  # first try + 3 recycles
    assert rollout.buffer.prompt_states()[0] == "dropped:starved"
    assert sum(o.metrics[M + "recycled"] for o in outputs) == 3
    assert sum(o.metrics[M + "starved"] for o in outputs) == 1
    assert all(0 not in [g[0].group_index for g in o.samples] for o in outputs)
