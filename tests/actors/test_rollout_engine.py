"""RolloutEngine: sampling, version labels, pause (abort and in-place partial rollout), per-token
versions and log-probs across an update, and the epoch fence (on real Ray)."""

from __future__ import annotations

import threading

import pytest
import ray
import torch

from actors.dataset_task import DatasetTask
from actors.errors import EngineStateError, StaleEpochError
from actors.policies.policy import PolicyConfig, PolicyError, build_policy
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.publishing.weight_sync import collect_weights, tensors_checksum
from actors.rewards import RewardFunction
from orchestrator.rollout.data.tokenizer import HFTokenizer
from orchestrator.rollout.errors import TokenizerError, VersionLabelError
from orchestrator.rollout.types import SampleStatus
from tests.waiting import wait_until

CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
# A long context and answer budget so a generate call lasts long enough to be interrupted.
LONG_CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size, max_sequence_length=96)
LONG_SAMPLING = {"max_new_tokens": 90}
TASK = AdditionTask(seed=0)


def test_generate_returns_stamped_scored_samples() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    prompt = TASK.make_prompt(3)

    samples = engine.generate(prompt, n_samples=6, group_index=11)

    assert len(samples) == 6
    for sample in samples:
        assert sample.weight_versions == [0]
        assert sample.group_index == 11
        assert sample.prompt_tokens == list(prompt.tokens)
        assert 1 <= len(sample.response_tokens) <= engine.sampling.max_new_tokens
        assert len(sample.rollout_log_probs) == len(sample.response_tokens)
        assert all(lp <= 0.0 for lp in sample.rollout_log_probs)
        assert sample.reward == TASK.reward(prompt, sample.response_tokens)
        finished = sample.response_tokens[-1] == TOKENIZER.eos_id
        assert sample.status is (SampleStatus.COMPLETED if finished else SampleStatus.TRUNCATED)


def test_an_engine_loads_its_tokenizer_when_made_so_a_missing_one_fails_its_start(
        tmp_path) -> None:
    # Not on the first request's threads (seconds of imports while the batch waits), and not
    # as a first group that fails only once the run is going.
    task = DatasetTask(HFTokenizer(tmp_path / "no-tokenizer-here"),
                       RewardFunction(custom_rm_path="tests.reward_fixtures.exact"))

    with pytest.raises(TokenizerError, match="no loadable tokenizer"):
        RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=task)


def test_pause_aborts_in_flight_call_and_holds_new_ones() -> None:
    engine = RolloutEngine("engine-0", "torch", LONG_CONFIG, seed=0, task=TASK,
                           sampling=LONG_SAMPLING, paused_wait_timeout_s=0.2)
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(engine.generate(TASK.make_prompt(0), 64, 0))
    )
    worker.start()
    wait_until(lambda: engine.health()["in_flight"] == 1, what="a generation in flight")

    aborted = engine.pause()
    worker.join(timeout=10)
    held = engine.generate(TASK.make_prompt(1), 2, 1)  # waits 0.2 s, then comes back aborted

    assert aborted == 1
    assert any(s.status is SampleStatus.ABORTED for s in results[0])
    assert all(s.weight_versions == [0] for s in results[0])
    assert all(s.status is SampleStatus.ABORTED for s in held)
    assert engine.health()["paused"] and engine.health()["in_flight"] == 0
    engine.continue_generation()
    resumed = engine.generate(TASK.make_prompt(1), 2, 1)
    assert all(s.status is not SampleStatus.ABORTED for s in resumed)


def test_weights_need_a_paused_engine() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    weights = collect_weights(build_policy("torch", CONFIG, seed=1), "full")

    with pytest.raises(EngineStateError):
        engine.load_weights(weights, epoch=1)


@pytest.mark.ray
def test_engine_refuses_weights_and_stamps_from_a_lower_epoch(ray_cluster) -> None:
    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
    engine = Engine.remote("engine-0", "torch", CONFIG, 0, TASK)
    new_weights = collect_weights(build_policy("torch", CONFIG, seed=1), "full")
    ray.get(engine.begin_update.remote(2))
    ray.get(engine.update_weight_version.remote(4, 2))
    before = ray.get(engine.health.remote())
    checksum_before = ray.get(engine.weights_checksum.remote())

    refused = []
    for call in (
        lambda: engine.begin_update.remote(1),
        lambda: engine.load_weights.remote(new_weights, 1, "full"),
        lambda: engine.update_weight_version.remote(9, 1),
        lambda: engine.continue_generation.remote(1),
        lambda: engine.stamp_and_resume.remote(9, 1),
    ):
        with pytest.raises(StaleEpochError) as raised:
            ray.get(call())
        refused.append(raised.value)

    after = ray.get(engine.health.remote())
    assert [e.operation for e in refused] == [
        "begin_update", "load_weights", "update_weight_version", "continue_generation",
        "update_weight_version",  # stamp_and_resume: refused at its stamp, not resumed
    ]
    assert all(e.epoch == 1 and e.highest_epoch == 2 for e in refused)
    assert ray.get(engine.weights_checksum.remote()) == checksum_before
    assert (after["version"], after["epoch"], after["paused"], after["weight_loads"]) == (
        before["version"], before["epoch"], before["paused"], before["weight_loads"]
    ) == (4, 2, True, 0)
    ray.kill(engine)


def test_stamp_and_resume_labels_then_serves_in_one_call() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    engine.begin_update(3)

    answer = engine.stamp_and_resume(5, 3)

    health = engine.health()
    assert answer == {"engine_id": "engine-0", "resume_error": None}
    assert (health["version"], health["epoch"], health["paused"]) == (5, 3, False)
    samples = engine.generate(TASK.make_prompt(1), 2, 1)
    assert all(s.weight_versions == [5] for s in samples)


def test_a_refused_stamp_leaves_the_engine_paused_with_its_label() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    engine.begin_update(3)
    engine.stamp_and_resume(5, 3)
    engine.begin_update(3)

    with pytest.raises(VersionLabelError):
        engine.stamp_and_resume(-1, 3)

    health = engine.health()
    assert (health["version"], health["paused"]) == (5, True)


@pytest.mark.ray
def test_pause_reaches_an_actor_while_it_generates(ray_cluster) -> None:
    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
    engine = Engine.remote("engine-0", "torch", LONG_CONFIG, 0, TASK, LONG_SAMPLING)
    ray.get(engine.health.remote())

    pending = engine.generate.remote(TASK.make_prompt(0), 64, 0)
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["in_flight"] == 1,
               what="a generation in flight")
    ray.get(engine.begin_update.remote(1))
    samples = ray.get(pending, timeout=30)

    assert any(s.status is SampleStatus.ABORTED for s in samples)
    assert ray.get(engine.health.remote())["paused"]
    ray.kill(engine)


# ----------------------------------------------------------------------------- partial rollout


def _spanning(samples):
    return [s for s in samples if len(set(s.token_versions)) > 1]


def _generating_in_place():
    """A real in-place engine actor two decode steps into a 64-sample call: the actor, the
    call's pending result, and the policies of versions 0 (its own) and 1 (different)."""
    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
    engine = Engine.remote("engine-0", "torch", LONG_CONFIG, 0, TASK, LONG_SAMPLING,
                           partial_rollout=True)
    old_model = build_policy("torch", LONG_CONFIG, seed=0).eval()
    new_model = build_policy("torch", LONG_CONFIG, seed=1).eval()
    ray.get(engine.health.remote())
    pending = engine.generate.remote(TASK.make_prompt(0), 64, 0)
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["decode_steps"] >= 2,
               what="two decode steps")
    return engine, pending, old_model, new_model


def _assert_each_token_is_its_versions_weights(sample, models) -> None:
    """Every response token's logged log-prob equals the log-prob the model of the version it
    is stamped with gives it (``models``: version -> policy)."""
    from actors.grpo import token_log_probs

    tokens = torch.tensor([sample.prompt_tokens + sample.response_tokens])
    start = len(sample.prompt_tokens) - 1
    end = start + len(sample.response_tokens)
    with torch.no_grad():
        by_version = {version: token_log_probs(model(tokens), tokens)[0, start:end]
                      for version, model in models.items()}
    for position, version in enumerate(sample.token_versions):
        assert sample.rollout_log_probs[position] == pytest.approx(
            float(by_version[version][position]), abs=1e-4), (position, version)


def test_in_place_pause_parks_a_call_past_the_timeout_then_it_aborts_with_its_tokens() -> None:
    engine = RolloutEngine("engine-0", "torch", LONG_CONFIG, seed=0, task=TASK,
                           sampling=LONG_SAMPLING, paused_wait_timeout_s=0.3,
                           partial_rollout=True)
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(engine.generate(TASK.make_prompt(0), 64, 0))
    )
    worker.start()
    wait_until(lambda: engine.health()["decode_steps"] >= 2, what="two decode steps")

    parked = engine.pause()
    health = engine.health()
    worker.join(timeout=10)  # nobody resumes: the parked call gives up after 0.3 s

    assert parked == 1
    assert health["pause_mode"] == "in_place"
    assert (health["in_flight"], health["running"]) == (1, 0)  # parked, not computing
    samples = results[0]
    assert any(s.status is SampleStatus.ABORTED for s in samples)
    assert all(len(s.response_tokens) >= 2 for s in samples if s.status is SampleStatus.ABORTED)
    assert all(s.token_versions == [0] * len(s.response_tokens) for s in samples)
    assert engine.health()["parked_calls"] == 1 and engine.health()["resumed_calls"] == 0


@pytest.mark.ray
def test_partial_rollout_sample_spans_the_update_with_exact_per_token_versions_and_log_probs(
        ray_cluster) -> None:
    """A real engine actor, paused in place mid-generation by the real update sequence."""
    from actors.publishing.weight_sync import (
        begin_engine_update,
        finalize_and_resume_engines,
        transfer_weights,
    )
    from orchestrator.rollout.staleness import Action, StalenessFilter
    from orchestrator.rollout.types import Group

    engine, pending, old_model, new_model = _generating_in_place()
    health = begin_engine_update([engine], epoch=1)[0]
    transfer_weights([engine], collect_weights(new_model, "full"), epoch=1, transport="full")
    report = finalize_and_resume_engines([engine], version=1, epoch=1)
    samples = ray.get(pending, timeout=60)

    assert health["in_flight"] == 1 and health["running"] == 0
    assert report.stamped_engine_ids == ["engine-0"]
    assert all(s.status is not SampleStatus.ABORTED for s in samples)  # nothing thrown away
    spanning = _spanning(samples)
    assert spanning, "no sample was still generating when the update landed"
    for sample in samples:
        assert len(sample.token_versions) == len(sample.response_tokens)
        assert sample.token_versions == sorted(sample.token_versions)  # 0s, then 1s
        assert sample.weight_versions == sorted(set([0] + sample.token_versions))
    for sample in spanning:
        assert sample.weight_versions == [0, 1]
        assert sample.oldest_weight_version == 0 and sample.version_span == 1
        _assert_each_token_is_its_versions_weights(sample, {0: old_model, 1: new_model})
    # Staleness uses the older version: measured at version 2 the group is 2 stale.
    verdict = StalenessFilter(max_weight_staleness=2).screen(
        Group(group_index=0, samples=samples), lambda _at_least: 2)
    assert verdict.action is Action.TRAIN and verdict.staleness == 2
    assert StalenessFilter(max_weight_staleness=1).screen(
        Group(group_index=0, samples=samples), lambda _at_least: 2).action is not Action.TRAIN
    ray.kill(engine)


# ----------------------------------------------------------------------------- in-flight swap


def test_staged_weights_wait_beside_the_serving_ones_until_the_swap() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    new_weights = collect_weights(build_policy("torch", CONFIG, seed=1), "full")
    serving = engine.weights_checksum()

    received = engine.stage_weights(new_weights, epoch=2)

    health = engine.health()
    assert received == tensors_checksum(new_weights) != serving
    assert (health["paused"], health["version"], health["epoch"]) == (False, 0, 2)
    assert engine.weights_checksum() == serving
    assert all(s.weight_versions == [0] for s in engine.generate(TASK.make_prompt(1), 2, 1))

    answer = engine.swap_and_stamp(7, 2)

    health = engine.health()
    assert answer == {"engine_id": "engine-0", "resume_error": None}
    assert (health["paused"], health["version"], health["weight_swaps"]) == (False, 7, 1)
    assert engine.weights_checksum() == received
    assert all(s.weight_versions == [7] for s in engine.generate(TASK.make_prompt(1), 2, 1))
    with pytest.raises(EngineStateError):  # the staged copy was used up
        engine.swap_and_stamp(8, 2)


def test_a_swap_is_refused_whole_without_weights_staged_at_its_epoch() -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, seed=0, task=TASK)
    new_weights = collect_weights(build_policy("torch", CONFIG, seed=1), "full")
    serving = engine.weights_checksum()

    with pytest.raises(EngineStateError):
        engine.swap_and_stamp(1, 1)  # nothing staged
    engine.stage_weights(new_weights, epoch=1)
    with pytest.raises(VersionLabelError):
        engine.swap_and_stamp(-1, 1)
    engine.stage_weights(new_weights, epoch=3)  # a newer publisher's stage replaces it
    with pytest.raises(StaleEpochError):
        engine.swap_and_stamp(1, 1)
    with pytest.raises(StaleEpochError):
        engine.stage_weights(new_weights, epoch=2)
    with pytest.raises(PolicyError):
        engine.stage_weights({"not.a.tensor": torch.zeros(1)}, epoch=3)

    health = engine.health()
    assert (health["paused"], health["version"], health["weight_swaps"]) == (False, 0, 0)
    assert engine.weights_checksum() == serving
    engine.swap_and_stamp(4, 3)
    assert engine.weights_checksum() == tensors_checksum(new_weights)


@pytest.mark.ray
def test_an_in_flight_swap_lands_mid_sample_with_exact_per_token_versions_and_log_probs(
        ray_cluster) -> None:
    """A real engine actor keeps generating while the update sequence's in-flight steps stage
    the next weights, then swaps them in between two of the sample's tokens."""
    from actors.publishing.weight_sync import (
        await_loaded,
        finalize_and_resume_engines,
        send_staged_weights,
        stage_weights,
    )
    from actors.transport import WeightSwap

    engine, pending, old_model, new_model = _generating_in_place()
    staged = stage_weights([engine], collect_weights(new_model, "full"))
    await_loaded(send_staged_weights([engine], staged, 1, "full", WeightSwap.IN_FLIGHT),
                 staged, swap=WeightSwap.IN_FLIGHT)
    staged_at = ray.get(engine.health.remote())["decode_steps"]
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["decode_steps"]
               >= staged_at + 2, what="two decode steps with weights staged")
    during = ray.get(engine.health.remote())
    report = finalize_and_resume_engines([engine], version=1, epoch=1,
                                         swap=WeightSwap.IN_FLIGHT)
    samples = ray.get(pending, timeout=60)

    assert (during["paused"], during["version"], during["parked_calls"]) == (False, 0, 0)
    assert report.stamped_engine_ids == ["engine-0"] and not report.failed
    assert all(s.status is not SampleStatus.ABORTED for s in samples)
    spanning = _spanning(samples)
    assert spanning, "no sample was still generating when the swap landed"
    for sample in spanning:
        assert sample.weight_versions == [0, 1]
        assert sample.token_versions == sorted(sample.token_versions)
        # Tokens decoded while the weights were staged are the old weights' (version 0).
        assert sample.token_versions[:during["decode_steps"]].count(0) >= 4
        _assert_each_token_is_its_versions_weights(sample, {0: old_model, 1: new_model})
    ray.kill(engine)


class _HeldStepEngine(RolloutEngine):
    """Test double: a decode step can be held mid-step (a long device step) and released."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hold = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()

    def _forward_step(self, tokens, decoder):
        logits = super()._forward_step(tokens, decoder)
        if self.hold.is_set():
            self.hold.clear()
            self.held.set()
            self.release.wait(timeout=30)
        return logits


def test_a_swap_waits_for_no_step_and_the_step_in_progress_keeps_the_old_label() -> None:
    engine = _HeldStepEngine("engine-0", "torch", LONG_CONFIG, seed=0, task=TASK,
                             sampling=LONG_SAMPLING, partial_rollout=True)
    old_model = build_policy("torch", LONG_CONFIG, seed=0).eval()
    new_model = build_policy("torch", LONG_CONFIG, seed=1).eval()
    engine.stage_weights(collect_weights(new_model, "full"), epoch=1)
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(engine.generate(TASK.make_prompt(0), 4, 0)))
    engine.hold.set()
    worker.start()
    assert engine.held.wait(timeout=30), "the step was never held"
    held_at = engine.health()["decode_steps"]  # tokens decoded before the held step

    swapper = threading.Thread(target=engine.swap_and_stamp, args=(1, 1))
    swapper.start()
    swapper.join(timeout=10)  # returns while the step is still held
    swapped_while_held = not swapper.is_alive() and not engine.release.is_set()
    restage = threading.Thread(target=engine.stage_weights,
                               args=(collect_weights(old_model, "full"), 1))
    restage.start()  # the old copy is now the standby, with the held step still on it
    restage.join(timeout=1)
    stage_waited = restage.is_alive()
    engine.release.set()
    restage.join(timeout=30)
    worker.join(timeout=60)

    assert swapped_while_held and stage_waited and not restage.is_alive()
    assert engine.health()["version"] == 1
    samples = results[0]
    spanning = _spanning(samples)
    assert spanning, [s.token_versions for s in samples]
    for sample in spanning:
        # The held step was the old copy's: its token (index held_at) is labelled 0.
        assert sample.token_versions[:held_at + 1] == [0] * (held_at + 1)
        assert set(sample.token_versions[held_at + 1:]) == {1}
        _assert_each_token_is_its_versions_weights(sample, {0: old_model, 1: new_model})


def test_an_abort_mode_swap_returns_calls_in_flight_with_old_tokens_only() -> None:
    engine = _HeldStepEngine("engine-0", "torch", LONG_CONFIG, seed=0, task=TASK,
                             sampling=LONG_SAMPLING, partial_rollout=False)
    engine.stage_weights(collect_weights(build_policy("torch", LONG_CONFIG, seed=1), "full"),
                         epoch=1)
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(engine.generate(TASK.make_prompt(0), 4, 0)))
    engine.hold.set()
    worker.start()
    assert engine.held.wait(timeout=30)

    engine.swap_and_stamp(1, 1)
    engine.release.set()
    worker.join(timeout=60)

    samples = results[0]
    assert any(s.status is SampleStatus.ABORTED for s in samples)
    assert all(set(s.token_versions) <= {0} for s in samples)
    assert all(s.weight_versions == [1] for s in engine.generate(TASK.make_prompt(1), 2, 1))
