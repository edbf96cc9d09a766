"""RayEnginePool on real engine actors: the groups started together reach each engine as one
batched call and come back whole; a dead engine's batch comes back aborted; a call the engine
never took comes back aborted, a slow one it holds is waited for; the cap holds; a process
holding the pool (the rollout manager) never imports torch."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import threading
import uuid

import pytest
import ray

from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.policies.policy import PolicyConfig
from actors.task import TOKENIZER, AdditionTask
from orchestrator.control.engine_pool.ray_pool import LostCallPolicy, RayEnginePool
from orchestrator.rollout.types import SampleStatus
from tests.waiting import wait_until

pytestmark = pytest.mark.ray

TASK = AdditionTask(seed=0)
CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
LONG_CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size, max_sequence_length=96)
QUICK_VERDICT = LostCallPolicy(lost_after_s=0.5, check_interval_s=0.3)


class _CallLosingEngine(RolloutEngine):
    """A real engine whose batched calls are lost: Ray delivers them, but the engine never
    takes them (what a call lost on its way, or answered into the void, looks like)."""

    def generate_batch(self, requests):
        threading.Event().wait()  # holds the Ray call forever, never registers its groups


def _engines(count: int, config: PolicyConfig = CONFIG, sampling=None) -> dict[str, object]:
    Engine = ray.remote(**{**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.1})(RolloutEngine)
    return {f"engine-{i}": Engine.remote(f"engine-{i}", "torch", config, seed=i, task=TASK,
                                         sampling=sampling)
            for i in range(count)}


def _generate_together(pool: RayEnginePool, groups: list[int], n_samples: int = 2):
    async def together():
        return await asyncio.gather(*(pool.generate(TASK.make_prompt(g), n_samples, g)
                                      for g in groups))

    return asyncio.run(together())


def _generate_calls(engine) -> int:
    return ray.get(engine.health.remote())["generate_calls"]


def test_groups_started_together_reach_each_engine_as_one_call(ray_cluster):
    engines = _engines(2)
    pool = RayEnginePool(engines, max_groups_per_call=8)

    results = _generate_together(pool, list(range(8)))

    assert (pool.calls_sent, pool.groups_sent) == (2, 8)  # one call per engine
    for group, samples in zip(range(8), results, strict=True):
        assert [s.group_index for s in samples] == [group, group]
        assert all(s.status is not SampleStatus.ABORTED for s in samples)
        assert all(len(s.rollout_log_probs) == len(s.response_tokens) for s in samples)
    # Least-loaded dispatch still spreads the groups: four each, run as four generates.
    assert [_generate_calls(engine) for engine in engines.values()] == [4, 4]


def test_one_group_per_call_when_batching_is_off_and_the_cap_splits_a_batch(ray_cluster):
    single = RayEnginePool(_engines(1), max_groups_per_call=1)
    _generate_together(single, list(range(5)))
    assert (single.calls_sent, single.groups_sent) == (5, 5)

    capped = RayEnginePool(_engines(1), max_groups_per_call=3)
    results = _generate_together(capped, list(range(8)))
    assert (capped.calls_sent, capped.groups_sent) == (3, 8)  # 3 + 3 + 2
    assert [samples[0].group_index for samples in results] == list(range(8))


def test_a_batch_on_an_engine_that_dies_comes_back_aborted(ray_cluster):
    engines = _engines(2, LONG_CONFIG, sampling={"max_new_tokens": 90})
    pool = RayEnginePool(engines, max_groups_per_call=8)
    victim = engines["engine-0"]
    pid = ray.get(victim.pid.remote())

    async def scenario():
        calls = [asyncio.ensure_future(pool.generate(TASK.make_prompt(g), 64, g))
                 for g in range(4)]
        await asyncio.sleep(0)  # the batch is sent at the end of this turn
        await asyncio.to_thread(wait_until,
                                lambda: ray.get(victim.health.remote())["running"] > 0,
                                what="the victim's batch generating")
        os.kill(pid, signal.SIGKILL)
        return await asyncio.gather(*calls)

    results = asyncio.run(scenario())

    by_engine = {0: [], 1: []}
    for group, samples in enumerate(results):  # least-loaded: groups 0, 2 -> engine-0
        by_engine[group % 2].append(samples)
    assert all(s.status is SampleStatus.ABORTED for batch in by_engine[0] for s in batch)
    assert all(s.metadata["aborted_by"] == "death of engine engine-0"
               for batch in by_engine[0] for s in batch)
    assert all(s.status is not SampleStatus.ABORTED for batch in by_engine[1] for s in batch)
    assert pool.alive_ids() == ["engine-1"]


def test_the_late_failure_of_a_replaced_engine_leaves_its_replacement_alive(ray_cluster):
    old = _engines(1, LONG_CONFIG, sampling={"max_new_tokens": 90})["engine-0"]
    new = _engines(1)["engine-0"]
    pool = RayEnginePool({"engine-0": old}, max_groups_per_call=8)
    pid = ray.get(old.pid.remote())

    async def scenario():
        call = asyncio.ensure_future(pool.generate(TASK.make_prompt(0), 64, 0))
        await asyncio.sleep(0)
        await asyncio.to_thread(wait_until, lambda: ray.get(old.health.remote())["running"],
                                what="the old engine generating")
        pool.replace("engine-0", new)  # the supervisor restarted it while the call ran
        os.kill(pid, signal.SIGKILL)
        return await call

    samples = asyncio.run(scenario())

    assert all(s.status is SampleStatus.ABORTED for s in samples)
    assert pool.alive_ids() == ["engine-0"]  # the new engine, not marked dead by the old one
    assert _generate_together(pool, [1])[0][0].status is not SampleStatus.ABORTED


def test_a_call_the_engine_never_took_comes_back_aborted_and_is_counted(ray_cluster):
    Engine = ray.remote(**{**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.1})(_CallLosingEngine)
    engine = Engine.remote("engine-0", "torch", CONFIG, seed=0, task=TASK)
    pool = RayEnginePool({"engine-0": engine}, max_groups_per_call=8, lost_calls=QUICK_VERDICT)

    results = _generate_together(pool, [0, 1])

    assert pool.calls_lost == 1
    for group, samples in zip([0, 1], results, strict=True):
        assert [s.group_index for s in samples] == [group, group]
        assert all(s.status is SampleStatus.ABORTED for s in samples)
        assert all(s.metadata["aborted_by"] == "call lost by engine engine-0" for s in samples)
    assert pool.alive_ids() == ["engine-0"]  # lost a call, not dead: it is sent work again
    ray.kill(engine)


def test_a_slow_call_the_engine_holds_is_waited_for_not_given_up(ray_cluster, caplog):
    Engine = ray.remote(**{**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.1})(RolloutEngine)
    engine = Engine.remote("engine-0", "torch", CONFIG, seed=0, task=TASK,
                           paused_wait_timeout_s=60)
    policy = dataclasses.replace(QUICK_VERDICT, slow_warning_s=1.0)
    pool = RayEnginePool({"engine-0": engine}, max_groups_per_call=8, lost_calls=policy)
    ray.get(engine.pause.remote())  # the call waits for the resume: held, not lost

    async def scenario():
        calls = asyncio.gather(*(pool.generate(TASK.make_prompt(g), 2, g) for g in (0, 1)))
        await asyncio.sleep(6 * QUICK_VERDICT.check_interval_s + QUICK_VERDICT.lost_after_s)
        held = await engine.health.remote()
        await engine.continue_generation.remote()
        return held, await calls

    held, results = asyncio.run(scenario())

    assert held["groups_in_flight"] == [0, 1] and held["calls"] == 1
    assert pool.calls_lost == 0
    assert all(s.status is not SampleStatus.ABORTED for samples in results for s in samples)
    slow = [r.getMessage() for r in caplog.records if "has held a call" in r.getMessage()]
    assert len(slow) == 1 and "groups [0, 1]" in slow[0] and "'paused': True" in slow[0]


def test_an_engine_error_reaches_every_group_of_the_call(ray_cluster):
    pool = RayEnginePool(_engines(1), max_groups_per_call=8)
    too_long = TASK.make_prompt(0)
    too_long = type(too_long)(index=0, tokens=(1,) * CONFIG.max_sequence_length)

    async def scenario():
        return await asyncio.gather(pool.generate(too_long, 2, 0),
                                    pool.generate(TASK.make_prompt(1), 2, 1),
                                    return_exceptions=True)

    errors = asyncio.run(scenario())
    assert all("leaves no room to answer" in str(error) for error in errors)


def test_a_process_holding_engine_handles_generates_without_importing_torch(ray_cluster):
    """The rollout manager's place: Ray loads an actor's class wherever its handle is
    deserialized, so the engine's module must not import torch (issue 25 item 2)."""

    class HandleHolder:  # defined here, so pickled by value: its process imports no test module
        def __init__(self, pool: RayEnginePool) -> None:
            self.pool = pool

        def generate(self, prompt) -> tuple[list[str], bool]:
            import sys

            samples = asyncio.run(self.pool.generate(prompt, 2, 0))
            return [sample.status.value for sample in samples], "torch" in sys.modules

    own_worker = {"env_vars": {"RL_LEDGER_TEST_WORKER": uuid.uuid4().hex}}  # never a reused one
    holder = ray.remote(num_cpus=0, runtime_env=own_worker)(HandleHolder).remote(
        RayEnginePool(_engines(1), max_groups_per_call=8))

    statuses, imported_torch = ray.get(holder.generate.remote(TASK.make_prompt(0)), timeout=120)

    assert len(statuses) == 2
    assert set(statuses) <= {SampleStatus.COMPLETED.value, SampleStatus.TRUNCATED.value}
    assert imported_torch is False
