"""DataBuffer: staleness screen, recycling, drop reasons, anti-starvation, accounting."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.metric_keys import FULLY_ASYNC_PREFIX, TRAIN_STALENESS_MAX_KEY
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from orchestrator.rollout.staleness import reject_uniform_rewards
from orchestrator.rollout.step_metrics import train_staleness_metrics
from orchestrator.rollout.types import Group, Prompt, Sample, SampleStatus
from tests.fake_engines import make_prompt, run_async, settle

M = FULLY_ASYNC_PREFIX


def make_group(
    prompt: Prompt,
    version: int | None,
    *,
    status: SampleStatus = SampleStatus.COMPLETED,
    rewards: tuple[float, ...] = (0.0, 1.0),
    recycle_count: int = 0,
) -> Group:
    samples = [
        Sample(
            index=i,
            group_index=prompt.index,
            prompt_tokens=list(prompt.tokens),
            reward=reward,
            status=status,
            weight_versions=[] if version is None else [version],
            recycle_count=recycle_count,
        )
        for i, reward in enumerate(rewards)
    ]
    return Group(group_index=prompt.index, samples=samples)


async def produce(buffer: DataBuffer, source: PromptSource, version: int | None, **kw) -> Prompt:
    prompt, recycle_count = buffer.take_prompt(source)
    await buffer.put(make_group(prompt, version, recycle_count=recycle_count, **kw))
    return prompt


def test_fresh_groups_are_claimed_trained_and_measured():
    async def scenario():
        buffer, source = DataBuffer(4, max_weight_staleness=2), PromptSource(make_prompt)
        await produce(buffer, source, 5)
        await produce(buffer, source, 4)
        first = await buffer.get(6)
        second = await buffer.get(6)
        assert buffer.accounting().claimed == 2
        buffer.commit([first, second])
        return buffer, buffer.pop_step_metrics()

    buffer, metrics = run_async(scenario)

    assert metrics[M + "staleness_avg"] == 1.5
    assert metrics[M + "staleness_max"] == 2
    assert metrics[M + "staleness_hist"] == {1: 1, 2: 1}
    assert metrics[M + "trained"] == 2
    assert metrics[M + "negative_staleness_total"] == 0
    assert buffer.prompt_states() == {0: "trained", 1: "trained"}
    assert buffer.accounting().balanced


def test_stale_group_is_recycled_under_retry_and_comes_back_first():
    async def scenario():
        buffer, source = DataBuffer(4, max_weight_staleness=2), PromptSource(make_prompt)
        stale = await produce(buffer, source, 0)
        fresh = await produce(buffer, source, 5)
        got = await buffer.get(5)
        again, recycle_count = buffer.take_prompt(source)
        return buffer, stale, fresh, got, again, recycle_count

    buffer, stale, fresh, got, again, recycle_count = run_async(scenario)

    assert got.group_index == fresh.index
    assert again == stale and recycle_count == 1  # before any fresh prompt
    metrics = buffer.pop_step_metrics()
    assert metrics[M + "stale_filtered"] == 1
    assert metrics[M + "recycled"] == 1
    assert metrics[M + "dropped_total"] == 0


def test_stale_group_is_dropped_under_drop():
    async def scenario():
        buffer = DataBuffer(4, max_weight_staleness=2, unused_samples_handler="drop")
        source = PromptSource(make_prompt)
        await produce(buffer, source, 0)
        await produce(buffer, source, 5)
        await buffer.get(5)
        return buffer

    buffer = run_async(scenario)

    assert buffer.prompt_states()[0] == "dropped:stale"
    assert buffer.dropped_prompts() == {0: "stale"}  # prompt 1, claimed, is not in it
    metrics = buffer.pop_step_metrics()
    assert metrics[M + "stale_filtered"] == 1
    assert metrics[M + "dropped/stale"] == 1
    assert metrics[M + "recycled"] == 0
    assert buffer.accounting().dropped == {"stale": 1}


@pytest.mark.parametrize(
    ("handler", "expected"), [("retry", "pending"), ("drop", "dropped:aborted")]
)
def test_aborted_group_is_recycled_or_dropped(handler, expected):
    async def scenario():
        buffer = DataBuffer(4, unused_samples_handler=handler)
        source = PromptSource(make_prompt)
        await produce(buffer, source, 3, status=SampleStatus.ABORTED)
        await produce(buffer, source, 3)
        await buffer.get(3)
        return buffer

    buffer = run_async(scenario)

    assert buffer.prompt_states()[0] == expected
    assert buffer.pop_step_metrics()[M + "aborted_filtered"] == 1


def test_dynamic_filter_reject_is_dropped_even_under_retry():
    async def scenario():
        buffer = DataBuffer(4, dynamic_filter=reject_uniform_rewards)
        source = PromptSource(make_prompt)
        await produce(buffer, source, 1, rewards=(1.0, 1.0))
        await produce(buffer, source, 1)
        got = await buffer.get(1)
        return buffer, got

    buffer, got = run_async(scenario)

    assert got.group_index == 1
    assert buffer.prompt_states()[0] == "dropped:no_signal"
    assert buffer.pending_count == 0
    metrics = buffer.pop_step_metrics()
    assert metrics[M + "dropped/no_signal"] == 1 and metrics[M + "dynamic_filtered"] == 1


def test_group_without_version_is_counted_and_recycled_even_under_drop():
    async def scenario():
        buffer = DataBuffer(4, unused_samples_handler="drop")
        source = PromptSource(make_prompt)
        await produce(buffer, source, None)
        await produce(buffer, source, 0)
        await buffer.get(0)
        return buffer

    buffer = run_async(scenario)

    assert buffer.missing_version_total == 1
    assert buffer.prompt_states()[0] == "pending"


def test_negative_staleness_is_counted_and_never_trained():
    seen: list[int] = []

    def current(at_least: int) -> int:
        seen.append(at_least)
        return 3  # a provider that failed to catch up with the ledger

    async def scenario():
        buffer = DataBuffer(4, unused_samples_handler="drop")
        source = PromptSource(make_prompt)
        await produce(buffer, source, 7)
        await produce(buffer, source, 2)
        got = await buffer.get(current)
        return buffer, got

    buffer, got = run_async(scenario)

    assert seen == [7, 2]  # the provider is asked with each group's oldest version
    assert got.group_index == 1
    assert buffer.negative_staleness_total == 1
    assert buffer.prompt_states()[0] == "dropped:negative_staleness"
    assert buffer.pop_step_metrics()[M + "negative_staleness_total"] == 1


def test_always_stale_prompt_is_recycled_max_recycles_times_then_starved():
    async def scenario():
        buffer = DataBuffer(4, max_weight_staleness=1, max_recycles=2)
        source = PromptSource(make_prompt)
        counts = []
        for _ in range(3):
            prompt, recycle_count = buffer.take_prompt(source)
            assert prompt.index == 0  # the recycled prompt always goes first
            counts.append(recycle_count)
            await buffer.put(make_group(prompt, 0, recycle_count=recycle_count))
            await produce(buffer, source, 10)  # a fresh group so get can return
            buffer.commit([await buffer.get(10)])
        return buffer, counts

    buffer, counts = run_async(scenario)

    assert counts == [0, 1, 2]
    assert buffer.prompt_states()[0] == "dropped:starved"
    assert buffer.dropped_prompts() == {0: "starved"}
    metrics = buffer.pop_step_metrics()
    assert metrics[M + "recycled"] == 2
    assert metrics[M + "starved"] == 1
    assert metrics[M + "dropped/starved"] == 1
    assert buffer.accounting().balanced


def test_put_blocks_while_full_until_a_get():
    async def scenario():
        buffer, source = DataBuffer(2), PromptSource(make_prompt)
        await produce(buffer, source, 0)
        await produce(buffer, source, 0)
        blocked = asyncio.create_task(produce(buffer, source, 0))
        await settle()
        was_blocked = not blocked.done()
        queued_while_blocked = buffer.queue_size
        await buffer.get(0)
        await asyncio.wait_for(blocked, 1.0)
        return was_blocked, queued_while_blocked, buffer.queue_size

    was_blocked, queued_while_blocked, queued_after = run_async(scenario)

    assert was_blocked and queued_while_blocked == 2
    assert queued_after == 2


def test_release_returns_claimed_groups_to_the_front_in_order():
    async def scenario():
        buffer, source = DataBuffer(4), PromptSource(make_prompt)
        for _ in range(3):
            await produce(buffer, source, 0)
        claimed = [await buffer.get(0), await buffer.get(0)]
        buffer.release(claimed)
        return buffer, [(await buffer.get(0)).group_index for _ in range(3)]

    buffer, order = run_async(scenario)

    assert order == [0, 1, 2]
    assert buffer.accounting().claimed == 3


def test_returned_prompt_keeps_its_recycle_count_and_goes_first():
    buffer, source = DataBuffer(4), PromptSource(make_prompt)
    first, _ = buffer.take_prompt(source)
    buffer.take_prompt(source)

    buffer.return_prompt(first.index)

    assert buffer.take_prompt(source) == (first, 0)
    assert buffer.accounting().in_flight == 2


def test_state_round_trip_keeps_every_unfinished_prompt():
    async def scenario():
        buffer = DataBuffer(4, max_weight_staleness=0)
        source = PromptSource(make_prompt)
        await produce(buffer, source, 0)  # -> stale, recycled (pending, count 1)
        await produce(buffer, source, 1)  # -> claimed then trained
        buffer.commit([await buffer.get(1)])
        await produce(buffer, source, 1)  # buffered  (index 0 recycled comes first)
        buffer.take_prompt(source)  # in flight (index 2)
        return buffer

    buffer = run_async(scenario)
    state = buffer.state_dict()
    restored = DataBuffer(4)
    restored.load_state_dict(state, make_prompt)

    assert {tuple(entry) for entry in state["pending"]} == {(0, 1), (2, 0)}
    assert restored.prompt_states() == {0: "pending", 2: "pending"}
    assert restored.recycle_counts() == {0: 1, 2: 0}
    accounting = restored.accounting()
    assert (accounting.entered, accounting.trained, accounting.pending) == (3, 1, 2)
    assert accounting.balanced
    with pytest.raises(RuntimeError):
        restored.load_state_dict(state, make_prompt)


# ----------------------------------------------------------------------------- partial rollout


def spanning_group(prompt: Prompt, token_versions: list[list[int]]) -> Group:
    """A group whose samples' tokens came from the given versions (partial rollout)."""
    samples = [
        Sample(index=i, group_index=prompt.index, prompt_tokens=list(prompt.tokens),
               response_tokens=[5] * len(versions), rollout_log_probs=[-0.5] * len(versions),
               reward=float(i), weight_versions=sorted(set(versions)),
               token_versions=versions)
        for i, versions in enumerate(token_versions)
    ]
    return Group(group_index=prompt.index, samples=samples)


def test_staleness_of_a_spanning_group_is_measured_from_its_oldest_token():
    async def scenario():
        buffer, source = DataBuffer(4, max_weight_staleness=2), PromptSource(make_prompt)
        too_old, _ = buffer.take_prompt(source)
        fresh, _ = buffer.take_prompt(source)
        await buffer.put(spanning_group(too_old, [[2, 4], [4, 4]]))  # 5 - 2 = 3 > 2
        await buffer.put(spanning_group(fresh, [[3, 3, 4], [4, 4, 4]]))  # 5 - 3 = 2
        group = await buffer.get(5)
        buffer.commit([group])
        return buffer, group, buffer.pop_step_metrics()

    buffer, group, metrics = run_async(scenario)

    assert group.group_index == 1
    assert metrics[M + "staleness_hist"] == {2: 1}  # from its oldest token, not its newest
    assert metrics[M + "stale_filtered"] == 1
    assert buffer.prompt_states() == {0: "pending", 1: "trained"}  # recycled, not trained
    assert metrics[M + "negative_staleness_total"] == 0


@pytest.mark.parametrize(("handler", "expected"), [("retry", "pending"),
                                                    ("drop", "dropped:partial_span")])
def test_a_sample_spanning_more_than_max_partial_span_versions_is_not_trained(handler, expected):
    async def scenario():
        buffer = DataBuffer(4, max_weight_staleness=None, unused_samples_handler=handler,
                            max_partial_span=1)
        source = PromptSource(make_prompt)
        prompt, _ = buffer.take_prompt(source)
        await buffer.put(spanning_group(prompt, [[7, 9], [9]]))  # span 2 > 1
        prompt, _ = buffer.take_prompt(source)
        await buffer.put(spanning_group(prompt, [[8, 9], [9]]))  # span 1: trained
        group = await buffer.get(9)
        buffer.commit([group])
        return buffer, group, buffer.pop_step_metrics()

    buffer, group, metrics = run_async(scenario)

    assert group.group_index == 1
    assert buffer.prompt_states()[0] == expected
    assert metrics[M + "partial_span_filtered"] == 1
    assert metrics[M + "tokens_discarded"] == 3
    assert buffer.accounting().balanced


def test_step_metrics_count_mixed_versions_and_tokens_kept_across_updates():
    async def scenario():
        buffer, source = DataBuffer(4), PromptSource(make_prompt)
        groups = []
        for versions in ([[1, 1, 2], [2, 2]], [[2], [2, 2, 2]]):
            prompt, _ = buffer.take_prompt(source)
            await buffer.put(spanning_group(prompt, versions))
            groups.append(await buffer.get(2))
        buffer.commit(groups)
        return buffer.pop_step_metrics()

    metrics = run_async(scenario)

    assert metrics[M + "mixed_version_ratio"] == 0.25  # 1 of 4 samples spans two versions
    assert metrics[M + "version_span_max"] == 1
    assert metrics[M + "tokens_kept_across_updates"] == 2  # its two version-1 tokens
    assert metrics[M + "tokens_trained"] == 9
    assert metrics[M + "tokens_discarded"] == 0


def test_train_time_staleness_is_measured_from_the_version_the_batch_trains_on():
    prompts = [make_prompt(index) for index in range(3)]
    one_version = make_group(prompts[0], 4).samples
    spanning = make_group(prompts[1], 5).samples
    spanning[1].token_versions = [3] * len(spanning[1].response_tokens)
    spanning[1].weight_versions = [3, 5]  # paused under v3, finished under v5
    unstamped = make_group(prompts[2], None).samples

    metrics = train_staleness_metrics([one_version, spanning, unstamped], trainer_version=5)

    # 5 - 4 and 5 - 3 (the oldest token decides); the unstamped group is left out.
    assert metrics[M + "train_staleness_avg"] == 1.5
    assert metrics[TRAIN_STALENESS_MAX_KEY] == 2
    assert train_staleness_metrics([], trainer_version=5) == {
        M + "train_staleness_avg": 0.0, TRAIN_STALENESS_MAX_KEY: 0}
