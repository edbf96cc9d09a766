"""Staleness-aware admission control: the bound, its pacing, and slots given back."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.metric_keys import FULLY_ASYNC_PREFIX
from orchestrator.rollout.admission import AdmissionControl, AdmissionLoad
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from orchestrator.rollout.producer import FullyAsyncRolloutFn
from orchestrator.rollout.types import RolloutFnTrainInput, SampleStatus
from tests.fake_engines import FakeEnginePool, make_prompt, run_async, settle
from tests.waiting import wait_until_async

M = FULLY_ASYNC_PREFIX


class Version:
    """The manager's version, as the producer sees it (a callable), moved by the test."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def make_rollout(pool, version: Version, *, staleness: int | None = 1, batch: int = 2,
                 interval: int = 1, concurrency: int = 4, capacity: int = 16,
                 stall_warning_s: float = 30.0, **buffer_options) -> FullyAsyncRolloutFn:
    return FullyAsyncRolloutFn(
        pool, PromptSource(make_prompt),
        DataBuffer(capacity, max_weight_staleness=staleness, **buffer_options),
        rollout_batch_size=batch, n_samples_per_prompt=2, max_concurrent_groups=concurrency,
        admission=AdmissionControl(staleness, batch, interval), current_version=version,
        stall_warning_s=stall_warning_s,
    )


# ----------------------------------------------------------------------------- the formula


def test_limit_is_staleness_plus_versions_advanced_plus_one_batches_per_version():
    admission = AdmissionControl(max_weight_staleness=2, rollout_batch_size=16,
                                 update_weights_interval=2)
    admission.start(version=10, trained=40)  # a resumed run: counting starts here

    assert admission.limit(10) == (2 + 0 + 1) * 16 * 2
    assert admission.limit(13) == (2 + 3 + 1) * 16 * 2
    load = AdmissionLoad(trained=50, queued=7, in_flight=3)
    assert admission.occupancy(load) == 10 + 7 + 3
    admission.start(version=99, trained=0)  # a restarted producer keeps the first origin
    assert admission.origin == (10, 40)


def test_no_staleness_bound_means_no_admission_bound():
    admission = AdmissionControl(None, rollout_batch_size=4)
    admission.start(0, 0)

    assert admission.limit(0) is None
    assert admission.admits(0, AdmissionLoad(trained=10**6, queued=10**6, in_flight=10**6))


def test_a_hold_counts_one_group_held_back_when_it_ends():
    admission = AdmissionControl(0, rollout_batch_size=2)
    admission.start(0, 0)
    full = AdmissionLoad(trained=0, queued=1, in_flight=1)

    assert not admission.admits(0, full)
    assert not admission.admits(0, full)  # the same hold
    assert admission.holding
    assert admission.admits(1, full)  # a new version makes room
    metrics = admission.pop_metrics(1, full)

    assert metrics[M + "admission_held_back"] == 1
    assert metrics[M + "admission_admitted"] == 1
    assert metrics[M + "admission_held_s"] >= 0.0
    assert metrics[M + "admission_limit"] == 4
    assert admission.pop_metrics(1, full)[M + "admission_held_back"] == 0  # reset per step


def test_the_version_awaited_is_the_first_that_admits_one_more_group():
    admission = AdmissionControl(max_weight_staleness=1, rollout_batch_size=2,
                                 update_weights_interval=2)
    admission.start(version=3, trained=10)
    full = AdmissionLoad(trained=14, queued=3, in_flight=1)  # occupancy 8 = limit at v3

    awaited = admission.version_awaited(full)

    assert admission.occupancy(full) == admission.limit(3) == 8
    assert awaited == 4
    assert admission.admits(awaited, full) and not admission.admits(awaited - 1, full)
    assert AdmissionControl(None, 2).version_awaited(full) is None


def test_invalid_options_are_refused():
    with pytest.raises(ValueError):
        AdmissionControl(-1, 4)
    with pytest.raises(ValueError):
        AdmissionControl(1, 0)
    with pytest.raises(RuntimeError):
        AdmissionControl(1, 4).limit(0)  # never started


# ----------------------------------------------------------------------------- pacing


def test_producer_stops_at_the_bound_and_a_new_version_releases_one_batch():
    pool, version = FakeEnginePool(gated=True), Version(0)
    rollout = make_rollout(pool, version, staleness=1, batch=2, concurrency=8)

    async def scenario():
        rollout.start()
        await settle()
        started_at_v0 = len(pool.calls)
        pool.release_all()
        await settle()
        still_v0 = len(pool.calls)
        version.value = 1
        rollout.notify()
        await settle()
        at_v1 = len(pool.calls)
        await rollout.stop()
        return started_at_v0, still_v0, at_v1

    started_at_v0, still_v0, at_v1 = run_async(scenario)

    assert started_at_v0 == (1 + 0 + 1) * 2  # not the 8 the concurrency cap would allow
    assert still_v0 == started_at_v0  # finished groups stay queued: still counted
    assert at_v1 == started_at_v0 + 2  # one version = one batch of room


def test_a_drain_held_back_by_the_bound_says_so_in_its_stall_warning(caplog):
    pool, version = FakeEnginePool(), Version(0)
    rollout = make_rollout(pool, version, staleness=0, batch=2, concurrency=8,
                           stall_warning_s=0.02)

    def held_back_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if "rollout 1: no group" in r.getMessage()]

    async def scenario():
        first = await rollout.drain(RolloutFnTrainInput(rollout_id=0, weight_version=0),
                                    lambda _a: 0)
        second = asyncio.create_task(
            rollout.drain(RolloutFnTrainInput(rollout_id=1, weight_version=0), lambda _a: 0))
        await wait_until_async(lambda: held_back_warnings(), what="the held-back warning")
        version.value = 1  # the publish the drain waits for
        rollout.notify()
        output = await second
        await rollout.stop()
        return first, output

    with caplog.at_level(logging.WARNING, logger="orchestrator.rollout.producer"):
        first, second = run_async(scenario)

    assert len(first.samples) == len(second.samples) == 2
    warning = held_back_warnings()[0]
    assert "held back by the admission bound: occupancy 2 of limit 2 at v0" in warning
    assert "waiting for v1" in warning


def test_a_dropped_or_recycled_group_gives_its_slot_back():
    pool, version = FakeEnginePool(gated=True), Version(0)
    rollout = make_rollout(pool, version, staleness=0, batch=2, concurrency=8,
                           unused_samples_handler="drop")

    async def scenario():
        drain = asyncio.create_task(
            rollout.drain(RolloutFnTrainInput(0, 0), lambda _at_least: version.value))
        await settle()
        first = list(pool.waiting())
        pool.release(first[0], SampleStatus.ABORTED)  # dropped: its slot comes back
        await settle()
        replacement = [index for index in pool.waiting() if index not in first]
        pool.release_all()
        await settle()
        pool.release_all()
        output = await drain
        await rollout.stop()
        return first, replacement, output

    first, replacement, output = run_async(scenario)

    assert len(first) == 2  # (0 + 0 + 1) * 2
    assert len(replacement) == 1
    assert len(output.samples) == 2
    assert output.metrics[M + "admission_admitted"] == 3
    assert output.metrics[M + "dropped/aborted"] == 1


def test_a_filter_that_rejects_most_groups_cannot_starve_the_producer():
    pool, version = FakeEnginePool(), Version(0)
    rejected = iter(range(10**6))
    rollout = make_rollout(
        pool, version, staleness=0, batch=2, concurrency=2,
        dynamic_filter=lambda group: "no_signal" if next(rejected) % 4 else None,
    )

    async def scenario():
        output = await rollout.drain(RolloutFnTrainInput(0, 0), lambda _at_least: 0)
        await rollout.stop()
        return output

    output = run_async(scenario)

    assert len(output.samples) == 2
    assert output.metrics[M + "dynamic_filtered"] == 3  # 3 of the first 5 screened


# ----------------------------------------------------------------------------- property


actions = st.lists(
    st.sampled_from(["release", "release", "abort", "stale", "drain", "publish"]),
    min_size=3, max_size=30,
)
shapes = st.fixed_dictionaries({
    "staleness": st.integers(min_value=0, max_value=2),
    "batch": st.integers(min_value=1, max_value=3),
    "interval": st.integers(min_value=1, max_value=2),
    "concurrency": st.integers(min_value=1, max_value=5),
    "handler": st.sampled_from(["retry", "drop"]),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, steps=actions)
def test_producer_paces_exactly_to_the_bound_and_loses_no_prompt(shape, steps):
    """No group starts that the bound forbids; the producer never idles while it allows one
    (and the concurrency cap is not reached); every prompt stays accounted for."""
    pool, version = FakeEnginePool(gated=True), Version(0)
    rollout = make_rollout(
        pool, version, staleness=shape["staleness"], batch=shape["batch"],
        interval=shape["interval"], concurrency=shape["concurrency"], capacity=4,
        unused_samples_handler=shape["handler"], max_recycles=1,
    )
    admission, buffer = rollout.admission, rollout.buffer
    holds = []

    def check_at_generate(_index: int) -> None:
        limit = admission.limit(version.value)
        assert admission.occupancy(buffer.admission_load()) <= limit

    pool.on_generate = check_at_generate

    def check_paced() -> None:
        limit = admission.limit(version.value)
        occupancy = admission.occupancy(buffer.admission_load())
        assert occupancy <= limit
        assert buffer.in_flight_count <= shape["concurrency"]
        # Tight: below the cap, the producer is held only by the bound.
        assert buffer.in_flight_count == shape["concurrency"] or occupancy + 1 > limit
        assert buffer.accounting().balanced
        holds.append(occupancy + 1 > limit)

    def publish() -> None:
        version.value += 1
        pool.version = version.value
        rollout.notify()

    async def drain(rollout_id: int) -> None:
        task = asyncio.create_task(rollout.drain(
            RolloutFnTrainInput(rollout_id, version.value), lambda _at_least: version.value))
        for _ in range(200):
            await settle()
            if task.done():
                break
            if pool.waiting():
                pool.release(pool.waiting()[0])
            else:
                publish()  # the trainer publishes after a step: the bound's precondition
        assert task.done(), "drain made no progress"
        task.result()

    async def scenario():
        rollout.start()
        rollout_ids = iter(range(10**6))
        for kind in steps:
            await settle()
            if kind in ("release", "abort") and pool.waiting():
                status = SampleStatus.ABORTED if kind == "abort" else SampleStatus.COMPLETED
                pool.release(pool.waiting()[0], status)
            elif kind == "stale" and pool.waiting():
                # Stamped one version behind what staleness allows: screened out later.
                pool.stamp[pool.waiting()[0]] = max(0, version.value - shape["staleness"] - 1)
                pool.release(pool.waiting()[0])
            elif kind == "drain":
                await drain(next(rollout_ids))
            elif kind == "publish":
                publish()
            await settle()
            check_paced()
        await rollout.stop()

    run_async(scenario)

    accounting = buffer.accounting()
    assert accounting.balanced
    assert accounting.entered == rollout.source.next_index
    event(f"bound held the producer: {any(holds)}")
    event(f"trained: {accounting.trained > 0}")
