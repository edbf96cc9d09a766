"""Property test: commit / failover / stamp / push / produce / drain in any order.

Whatever the interleaving, the rollout path keeps DESIGN invariants 6 and 7: the manager's
version never decreases and is never above the ledger head, no staleness is negative, a push is
refused exactly when it is below the current version or above the head, and every prompt that
entered ends trained, recycled (pending), dropped with a reason, or still in flight/buffered.

And the admission bound (issue 11): no group is ever generated that the bound forbids (checked
at every generate call and after every action: trained since the start + queued + in flight <=
``(max_weight_staleness + v - v0 + 1) * rollout_batch_size``), and in flight never exceeds
``async_max_concurrent_samples``. The world publishes, as the trainer does after a step, when a
drain is held up only by the bound (its liveness precondition).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ledger import Ledger
from orchestrator.metric_keys import FULLY_ASYNC_PREFIX
from orchestrator.config import RunConfig
from orchestrator.rollout.errors import VersionAheadOfLedgerError, VersionRegressionError
from orchestrator.rollout.manager import RolloutManager
from orchestrator.rollout.types import SampleStatus
from tests.fake_engines import FakeEnginePool, make_prompt, run_async, settle

M = FULLY_ASYNC_PREFIX
DRAIN_RELEASE_LIMIT = 400

# (kind, push delta, abort? / commit during the drain?) with kinds repeated to weight them; unused fields are ignored.
KINDS = ["commit"] * 2 + ["failover", "stamp"] + ["push"] * 2 + ["produce"] * 4 + ["drain"] * 2
actions = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(min_value=-3, max_value=3),
        st.booleans() | st.just(False),
    ),
    min_size=5,
    max_size=40,
)

options = st.fixed_dictionaries(
    {
        "max_weight_staleness": st.sampled_from([None, 0, 1, 2]),
        "async_unused_samples_handler": st.sampled_from(["retry", "drop"]),
        "max_recycles": st.integers(min_value=0, max_value=2),
        "async_max_concurrent_samples": st.integers(min_value=1, max_value=3),
        "initial_commits": st.integers(min_value=0, max_value=3),
    }
)


@pytest.fixture(scope="module")
def shared_ledger_url(tmp_path_factory) -> str:
    """One SQLite file for the module; every example uses its own run id."""
    return f"sqlite:///{tmp_path_factory.mktemp('props') / 'ledger.db'}"


class World:
    """The ledger's publisher side, the engines and the manager of one example."""

    def __init__(self, url: str, option_values: dict) -> None:
        option_values = dict(option_values)
        initial_commits = option_values.pop("initial_commits")
        self.run_id = f"prop-{uuid.uuid4().hex[:10]}"
        self.ledger = Ledger.open(url)
        self.ledger.start_run(self.run_id, config={})
        self.cells = itertools.count()
        self.cell = f"cell-{next(self.cells)}"
        self.epoch = self.ledger.promote(self.run_id, self.cell, reason="start")
        for _ in range(initial_commits):
            self.commit()
        config = RunConfig(
            run_id=self.run_id,
            rollout_batch_size=2,
            n_samples_per_prompt=2,
            async_data_buffer_capacity_factor=2,
            **option_values,
        )
        self.pool = FakeEnginePool(version=self.head(), gated=True)
        self.manager = RolloutManager(url, self.run_id, config, make_prompt, self.pool)
        self.max_concurrent = config.async_max_concurrent_samples
        self.pool.on_generate = self.check_admission
        self.trained: list[int] = []
        self.refused = 0
        self.generated = 0
        self.publishes_for_liveness = 0
        self.last_version = self.manager.get_weight_version()

    def check_admission(self, _prompt_index: int) -> None:
        """At a generate call: the group was allowed by the bound and the concurrency cap."""
        self.generated += 1
        state = self.manager.admission_state()
        if state["limit"] is not None:
            assert state["occupancy"] <= state["limit"], state
        assert self.pool.in_flight <= self.max_concurrent

    def publish_if_only_the_bound_holds(self) -> None:
        """The trainer publishes after each step; without it the bound holds generation back."""
        if self.pool.waiting() or not self.manager.admission_state()["holding"]:
            return
        self.commit()
        self.pool.version = self.head()
        self.manager.set_weight_version(self.head())
        self.publishes_for_liveness += 1

    def head(self) -> int:
        return self.ledger.head(self.run_id).version

    def commit(self) -> int:
        return self.ledger.commit_weights(
            self.run_id, cell_id=self.cell, epoch=self.epoch, train_step=self.head()
        )

    def failover(self) -> None:
        self.cell = f"cell-{next(self.cells)}"
        self.epoch = self.ledger.promote(self.run_id, self.cell, reason="failover")

    def push(self, delta: int) -> None:
        current, head = self.manager.get_weight_version(), self.head()
        requested = max(0, current + delta)
        if requested < current or requested > head:
            self.refused += 1
        if requested < current:
            with pytest.raises(VersionRegressionError):
                self.manager.set_weight_version(requested)
        elif requested > head:
            with pytest.raises(VersionAheadOfLedgerError):
                self.manager.set_weight_version(requested)
        else:
            assert self.manager.set_weight_version(requested) == requested

    async def drain(self, rollout_id: int, commit_midway: bool) -> None:
        task = asyncio.create_task(self.manager.generate(rollout_id))
        for release in range(DRAIN_RELEASE_LIMIT):
            await settle()
            assert self.manager.metrics()[M + "negative_staleness_total"] == 0
            if task.done():
                break
            if commit_midway and release == 0:
                # A commit and stamp land while the drain runs, before anyone pushes; newest
                # requests finish first so the drain meets groups newer than its version.
                self.commit()
                self.pool.version = self.head()
            if release and release % 20 == 0:
                self.pool.version = self.head()  # the publisher finally stamps the engines
            if self.pool.waiting():
                self.pool.release(self.pool.waiting()[-1 if commit_midway else 0])
            else:
                self.publish_if_only_the_bound_holds()
        assert task.done(), "drain made no progress"
        output = task.result()
        indices = [group[0].group_index for group in output.samples]
        assert indices == sorted(indices)
        version = output.metrics[M + "weight_version"]
        assert all(
            min(sample.weight_versions) <= version for group in output.samples for sample in group
        )
        assert all(lag >= 0 for lag in output.metrics[M + "staleness_hist"])
        self.trained.extend(indices)

    def check_invariants(self) -> None:
        version = self.manager.get_weight_version()
        assert self.last_version <= version <= self.head()
        self.last_version = version
        metrics = self.manager.metrics()
        assert metrics[M + "negative_staleness_total"] == 0
        assert self.manager.accounting().balanced
        state = self.manager.admission_state()
        if state["limit"] is not None:
            assert state["occupancy"] <= state["limit"], state


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(option_values=options, steps=actions)
def test_any_interleaving_keeps_versions_monotonic_and_every_prompt_accounted(
    shared_ledger_url, option_values, steps
):
    world = World(shared_ledger_url, option_values)

    async def scenario():
        rollout_ids = itertools.count()
        await world.manager.start()  # the producer runs from the first action on
        for kind, delta, abort in steps:
            if kind == "commit":
                world.commit()
            elif kind == "failover":
                world.failover()
            elif kind == "stamp":
                world.pool.version = world.head()
            elif kind == "push":
                world.push(delta)
            elif kind == "produce" and world.pool.waiting():
                status = SampleStatus.ABORTED if abort else SampleStatus.COMPLETED
                world.pool.release(world.pool.waiting()[0], status)
            elif kind == "drain":
                await world.drain(next(rollout_ids), commit_midway=abort)
            await settle()
            world.check_invariants()
        await world.manager.shutdown()

    try:
        run_async(scenario)
    finally:
        world.ledger.close()

    states = world.manager.prompt_states()
    assert set(states) == set(range(world.manager.next_prompt_index()))
    assert len(world.trained) == len(set(world.trained))  # no prompt trained twice
    assert {i for i, state in states.items() if state == "trained"} == set(world.trained)
    allowed = {"pending", "in_flight", "buffered"}
    for index, state in states.items():
        assert state in allowed | {"trained"} or (
            state.startswith("dropped:") and len(state) > len("dropped:")
        ), (index, state)
    assert world.manager.accounting().balanced
    accounting = world.manager.accounting()
    event(f"trained groups > 0: {accounting.trained > 0}")
    event(f"dropped: {sorted(accounting.dropped)}")
    event(f"recycled some: {world.manager.metrics()[M + 'recycled_total'] > 0}")
    event(f"refused pushes: {world.refused > 0}")
    event(f"bound held a drain (world published): {world.publishes_for_liveness > 0}")
