"""RolloutManager: version from the ledger, refused pushes, restore from the ledger, as an actor."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from ledger import Ledger
from orchestrator.metric_keys import FULLY_ASYNC_PREFIX
from orchestrator.config import RunConfig
from orchestrator.control.provenance_recorder import ProvenanceRecorder
from orchestrator.rollout.errors import (
    RolloutVersionError,
    VersionAheadOfLedgerError,
    VersionRegressionError,
)
from orchestrator.rollout.manager import RolloutManager
from orchestrator.rollout.types import RolloutConfig, VersionLabelError
from tests.fake_engines import FakeEnginePool, build_ledger, make_prompt, run_async, settle

M = FULLY_ASYNC_PREFIX
RUN = "run-a"


def small_config(**overrides) -> RunConfig:
    fields = dict(
        run_id=RUN,
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        async_max_concurrent_samples=4,
        async_data_buffer_capacity_factor=2,
        max_weight_staleness=2,
    )
    fields.update(overrides)
    return RunConfig(**fields)


def make_manager(url: str, pool: FakeEnginePool, **overrides) -> RolloutManager:
    return RolloutManager(url, RUN, small_config(**overrides), make_prompt, pool)


def batch_versions(output) -> set[int]:
    return {v for group in output.samples for sample in group for v in sample.weight_versions}


def test_run_config_has_every_option_the_rollout_path_reads():
    # The rollout path is typed on the RolloutConfig protocol, never on RunConfig itself.
    assert isinstance(RunConfig(), RolloutConfig)


def test_seed_scenario_new_cell_pushing_1_is_refused_and_ledger_commit_wins(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=57)
    pool = FakeEnginePool(version=57)
    manager = make_manager(sqlite_url, pool)

    async def scenario():
        first = await manager.generate(0)
        # Failover: cell-1 is promoted and, with a counter that restarted, pushes 1.
        with Ledger.open(sqlite_url) as ledger:
            epoch = ledger.promote(RUN, "cell-1", reason="failover")
            with pytest.raises(VersionRegressionError) as refused:
                manager.set_weight_version(1)
            kept = manager.get_weight_version()
            # cell-1 commits its first update; the ledger says 58 (not 2).
            committed = ledger.commit_weights(RUN, cell_id="cell-1", epoch=epoch, train_step=57)
        second = await manager.generate(1)  # nobody pushed 58: the drain reads the ledger
        await manager.shutdown()
        return first, refused.value, kept, committed, second

    first, refused, kept, committed, second = run_async(scenario)

    assert batch_versions(first) == {57}
    assert first.metrics[M + "weight_version"] == 57
    assert first.metrics[M + "staleness_hist"] == {0: 4}
    assert (refused.requested, refused.reference) == (1, 57)
    assert kept == 57
    assert committed == 58
    assert second.metrics[M + "weight_version"] == 58
    assert second.metrics[M + "staleness_hist"] == {1: 4}  # samples stamped 57, current 58
    assert manager.get_weight_version() == 58
    metrics = manager.metrics()
    assert metrics["rollout_manager/version_regressions_refused"] == 1
    assert metrics[M + "negative_staleness_total"] == 0


def test_push_above_ledger_head_is_refused_and_valid_pushes_are_idempotent(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=3)
    manager = make_manager(sqlite_url, FakeEnginePool(version=3))

    with pytest.raises(VersionAheadOfLedgerError) as ahead:
        manager.set_weight_version(4)
    assert (ahead.value.requested, ahead.value.reference) == (4, 3)
    assert manager.get_weight_version() == 3
    assert manager.set_weight_version(3) == 3  # a retried push is a no-op
    with pytest.raises(VersionLabelError):
        manager.set_weight_version("4")  # type: ignore[arg-type]
    assert manager.metrics()["rollout_manager/version_ahead_refused"] == 1
    run_async(manager.shutdown)


def test_push_of_a_committed_version_moves_the_manager_forward(sqlite_url):
    epoch = build_ledger(sqlite_url, RUN, commits=1)
    manager = make_manager(sqlite_url, FakeEnginePool(version=1))
    with Ledger.open(sqlite_url) as ledger:
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)

    assert manager.set_weight_version(2) == 2
    with pytest.raises(VersionRegressionError):
        manager.set_weight_version(1)
    assert manager.get_weight_version() == 2
    run_async(manager.shutdown)


def test_group_newer_than_the_manager_triggers_a_ledger_read_not_a_negative_staleness(
    sqlite_url,
):
    epoch = build_ledger(sqlite_url, RUN, commits=4)
    pool = FakeEnginePool(version=4, gated=True)
    pool.stamp[0] = 5  # this engine is stamped with 5 as soon as 5 commits, before any push
    manager = make_manager(sqlite_url, pool, rollout_batch_size=1, async_max_concurrent_samples=1,
                           num_cells=1)  # one group per step needs one cell (RunConfig checks)

    async def scenario():
        drain = asyncio.create_task(manager.generate(0))  # reads head 4
        await settle()
        reads_before = manager.metrics()["rollout_manager/ledger_reads"]
        with Ledger.open(sqlite_url) as ledger:
            ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=4)
        pool.release_all()
        output = await drain
        await manager.shutdown()
        return output, reads_before

    output, reads_before = run_async(scenario)

    assert manager.get_weight_version() == 5
    assert manager.metrics()["rollout_manager/ledger_reads"] > reads_before
    assert output.metrics[M + "negative_staleness_total"] == 0
    assert output.metrics[M + "staleness_hist"] == {0: 1}
    assert output.metrics[M + "weight_version"] == 5


@pytest.mark.parametrize("error_type", [VersionRegressionError, VersionAheadOfLedgerError])
def test_version_errors_pickle_intact(error_type):
    error = error_type(1, 57)

    restored = pickle.loads(pickle.dumps(error))

    assert type(restored) is error_type
    assert isinstance(restored, RolloutVersionError) and isinstance(restored, ValueError)
    assert (restored.requested, restored.reference, str(restored)) == (1, 57, str(error))


def _record_first_batch_of_two(url: str, pool: FakeEnginePool) -> tuple[set[int], int]:
    """A manager drains two batches; the ledger records the first as trained (the second was
    in the driver's hand when the manager died). Returns the first's prompts and the ledger's
    prompt position."""
    manager = make_manager(url, pool)
    recorder_ledger = Ledger.open(url)

    async def first_life():
        first = await manager.generate(0)
        dropped, next_index = first.prompt_position.dropped, first.prompt_position.next_index
        ProvenanceRecorder(recorder_ledger, RUN).record(
            1, first, trainer_version=5, produced_version=None, cells=["cell-0"],
            drain_version=5, dropped_prompts=dropped, next_index=next_index, recycled=0)
        await manager.generate(1)
        await settle()
        await manager.shutdown()
        return first, next_index

    try:
        first, next_index = run_async(first_life)
    finally:
        recorder_ledger.close()
    return {group[0].group_index for group in first.samples}, next_index


def test_a_new_manager_continues_the_prompt_stream_the_ledger_records(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=5)
    trained, next_index = _record_first_batch_of_two(sqlite_url, FakeEnginePool(version=5))

    restarted_pool = FakeEnginePool(version=5)
    restarted = make_manager(sqlite_url, restarted_pool)
    pending = restarted.restore_from_ledger()
    after = restarted.prompt_states()

    assert set(after) == set(range(next_index)) - trained  # every unfinished prompt is back
    assert pending == len(after) > 0
    assert all(state == "pending" for state in after.values())
    assert restarted.next_prompt_index() == next_index
    assert restarted.accounting().balanced

    async def second_life():
        output = await restarted.generate(2)
        await restarted.shutdown()
        return output

    run_async(second_life)
    assert set(restarted_pool.calls[:pending]) == set(after)  # restored prompts first
    assert min(restarted_pool.calls[pending:]) >= next_index  # then fresh ones
    assert not trained & set(restarted_pool.calls)  # nothing trained is generated again


def test_a_new_manager_does_not_regenerate_the_prompts_the_driver_holds(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=5)
    trained, next_index = _record_first_batch_of_two(sqlite_url, FakeEnginePool(version=5))
    in_flight = sorted(set(range(next_index)) - trained)
    held = in_flight[:1]

    restarted = make_manager(sqlite_url, FakeEnginePool(version=5))
    pending = restarted.restore_from_ledger(held=held)

    assert pending == len(in_flight) - 1
    assert set(restarted.prompt_states()) == set(in_flight) - set(held)
    assert restarted.accounting().balanced  # the held prompt counts as trained
    run_async(restarted.shutdown)


def test_a_new_manager_continues_past_held_prompts_the_ledger_never_recorded(sqlite_url):
    """The lost manager issued prompts after the last batch_trained, and the driver holds a
    batch of two of them: the stream goes on past the newest held prompt, and the one it
    issued below that and nobody holds is regenerated."""
    build_ledger(sqlite_url, RUN, commits=5)
    trained, next_index = _record_first_batch_of_two(sqlite_url, FakeEnginePool(version=5))
    in_flight = set(range(next_index)) - trained
    held = [next_index + 1, next_index + 2]

    restarted_pool = FakeEnginePool(version=5)
    restarted = make_manager(sqlite_url, restarted_pool)
    pending = restarted.restore_from_ledger(held=held)

    assert restarted.next_prompt_index() == next_index + 3
    assert set(restarted.prompt_states()) == in_flight | {next_index}
    assert pending == len(in_flight) + 1
    assert restarted.accounting().balanced  # the held prompts count as trained

    async def second_life():
        await restarted.generate(2)
        await restarted.shutdown()

    run_async(second_life)
    assert not set(held) & set(restarted_pool.calls)  # a held prompt is never issued again
    assert not trained & set(restarted_pool.calls)


def test_a_drain_carries_the_prompt_position_its_batch_trained_records(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=0)
    manager = make_manager(sqlite_url, FakeEnginePool())

    async def drained():
        output = await manager.generate(0)
        as_drained = manager.provenance_snapshot()  # no other task ran since the drain
        await manager.shutdown()
        return output, as_drained

    output, (dropped, next_index) = run_async(drained)
    position = output.prompt_position
    assert position is not None
    assert (position.dropped, position.next_index) == (dropped, next_index)
    assert max(group[0].group_index for group in output.samples) < position.next_index


def test_restore_from_ledger_refuses_a_manager_that_already_generated(sqlite_url):
    build_ledger(sqlite_url, RUN, commits=0)
    manager = make_manager(sqlite_url, FakeEnginePool())

    async def started():
        await manager.generate(0)
        with pytest.raises(RuntimeError, match="fresh manager"):
            manager.restore_from_ledger()
        await manager.shutdown()

    run_async(started)


@pytest.mark.ray
def test_manager_as_ray_actor_refuses_regression_and_follows_the_ledger(ray_cluster, sqlite_url):
    ray = ray_cluster
    epoch = build_ledger(sqlite_url, RUN, commits=57)
    actor_class = ray.remote(num_cpus=0.25)(RolloutManager)
    manager = actor_class.remote(sqlite_url, RUN, small_config(), make_prompt,
                                 FakeEnginePool(version=57))

    first = ray.get(manager.generate.remote(0), timeout=60)
    with pytest.raises(VersionRegressionError) as refused:
        ray.get(manager.set_weight_version.remote(1), timeout=60)
    kept = ray.get(manager.get_weight_version.remote(), timeout=60)
    with Ledger.open(sqlite_url) as ledger:
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=57)
    second = ray.get(manager.generate.remote(1), timeout=60)
    metrics = ray.get(manager.metrics.remote(), timeout=60)
    ray.get(manager.shutdown.remote(), timeout=60)
    ray.kill(manager)

    assert [group[0].group_index for group in first.samples] == sorted(
        group[0].group_index for group in first.samples
    )
    assert first.metrics[M + "weight_version"] == 57
    assert "below the current version 57" in str(refused.value)
    assert kept == 57
    assert second.metrics[M + "weight_version"] == 58
    assert metrics["rollout_manager/version_regressions_refused"] == 1
    assert metrics["rollout_manager/prompts_unaccounted"] == 0


@pytest.mark.parametrize("sync", [True, False])
def test_sync_mode_generates_only_while_a_drain_waits(sqlite_url, sync: bool):
    epoch = build_ledger(sqlite_url, RUN, commits=0)
    pool = FakeEnginePool(version=0)
    manager = make_manager(sqlite_url, pool, sync=sync)

    async def scenario():
        first = await manager.generate(0)
        calls_after_drain = len(pool.calls)
        # The trainer's turn: it trains and publishes v1 (the admission bound makes room for
        # one more batch per version); an async producer keeps generating meanwhile.
        with Ledger.open(sqlite_url) as ledger:
            ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        manager.set_weight_version(1)
        await settle(200)
        calls_between_steps = len(pool.calls) - calls_after_drain
        second = await manager.generate(1)
        await manager.shutdown()
        return first, second, calls_between_steps

    first, second, calls_between_steps = run_async(scenario)

    assert len(first.samples) == len(second.samples) == 4
    if sync:
        assert calls_between_steps == 0
    else:
        assert calls_between_steps > 0
    accounting = manager.accounting()
    assert accounting.unaccounted == 0


def test_sync_mode_trains_on_policy_one_batch_per_version(sqlite_url):
    """--sync is the on-policy baseline: the bound admits exactly one batch per version."""
    epoch = build_ledger(sqlite_url, RUN, commits=0)
    pool = FakeEnginePool(version=0)
    manager = make_manager(sqlite_url, pool, sync=True, async_max_concurrent_samples=8)

    async def scenario():
        outputs = []
        with Ledger.open(sqlite_url) as ledger:
            for step in range(3):
                outputs.append(await manager.generate(step))
                version = ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch,
                                                train_step=step + 1)
                pool.version = version
                manager.set_weight_version(version)
        await manager.shutdown()
        return outputs

    outputs = run_async(scenario)

    assert len(pool.calls) == 3 * 4  # nothing generated beyond the batches
    for output in outputs:
        assert output.metrics[M + "staleness_hist"] == {0: 4}
    assert manager.accounting().trained == 12 and manager.accounting().balanced
