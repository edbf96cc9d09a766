"""Rewards of data-set tasks: the built-ins, custom functions (sync, async, batched), and a
reward function that raises: its group is dropped as reward_error, never scored 0."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from actors.dataset_task import DatasetTask
from actors.engines.scoring import score_group
from actors.rewards import RewardFunction, RewardLoadError
from orchestrator.rollout.data.tokenizer import HFTokenizer
from orchestrator.rollout.staleness import Action, Rejection, StalenessFilter
from orchestrator.rollout.types import Group, Prompt, Sample, SampleStatus
from tests import reward_fixtures
from tests.task_fixtures import make_tokenizer


def _score(reward: RewardFunction, responses: list[str], label: str) -> list[float]:
    count = len(responses)
    return reward.score(["q"] * count, responses, [label] * count, [{}] * count)


def test_exact_matches_after_normalising_case_space_and_a_final_period():
    assert _score(RewardFunction("exact"), [" Paris. ", "PARIS", "Paris!", "Lyon"],
                  "paris") == [1.0, 1.0, 0.0, 0.0]


def test_math_uses_math_verify_for_equivalent_answers():
    assert _score(RewardFunction("math"), ["The answer is 1/2", "$0.5$", "\\frac{2}{4}", "2"],
                  "0.5") == [1.0, 1.0, 1.0, 0.0]


def test_boxed_scores_the_boxed_answer_only():
    assert _score(RewardFunction("boxed"), ["so \\boxed{7}", "7", "\\boxed{8}"],
                  "7") == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("path", ["tests.reward_fixtures.exact", "tests.reward_fixtures:exact",
                                  "tests.reward_fixtures.exact_async",
                                  "tests.reward_fixtures.exact_batched"])
def test_a_custom_reward_is_loaded_by_name_sync_async_or_batched(path: str):
    reward = pickle.loads(pickle.dumps(RewardFunction(custom_rm_path=path)))  # as engines get it

    assert _score(reward, ["4", " 4 ", "5"], "4") == [1.0, 1.0, 0.0]


def test_a_custom_reward_gets_prompt_response_label_and_metadata(tmp_path: Path):
    tokenizer = HFTokenizer(make_tokenizer(tmp_path / "tok"))
    task = DatasetTask(tokenizer, RewardFunction(custom_rm_path="tests.reward_fixtures.exact"))
    prompt = Prompt(index=3, tokens=(1,), label="4", text="2+2=", metadata={"level": 1})
    reward_fixtures.CALLS.clear()

    rewards = task.score_group(prompt, [tokenizer.encode("4") + [tokenizer.eos_id],
                                        tokenizer.encode("5")])

    assert rewards == [1.0, 0.0]
    assert reward_fixtures.CALLS == [("2+2=", "4", "4", {"level": 1}),
                                     ("2+2=", "5", "4", {"level": 1})]


@pytest.mark.parametrize("path, message", [
    ("tests.no_such_module.f", "cannot import 'tests.no_such_module'"),
    ("tests.reward_fixtures.missing", "has no function 'missing'"),
])
def test_an_unimportable_reward_is_refused_in_one_line(path: str, message: str):
    with pytest.raises(RewardLoadError, match=message):
        RewardFunction(custom_rm_path=path)


@pytest.mark.parametrize("name", ["raises", "not_a_number"])
def test_a_failing_reward_marks_the_group_and_never_becomes_zero_silently(tmp_path: Path,
                                                                          name: str):
    tokenizer = HFTokenizer(make_tokenizer(tmp_path / "tok"))
    task = DatasetTask(tokenizer, RewardFunction(custom_rm_path=f"tests.reward_fixtures.{name}"))
    prompt = Prompt(index=0, tokens=(1,), label="4", text="2+2=")
    statuses = [SampleStatus.COMPLETED, SampleStatus.TRUNCATED]

    rewards, error = score_group(task, prompt, [[5], [6]], statuses)

    assert error is not None and ("ZeroDivisionError" in error or "TypeError" in error)
    group = Group(0, [Sample(index=i, group_index=0, prompt_tokens=[1], reward=r,
                             weight_versions=[0], reward_error=error)
                      for i, r in enumerate(rewards)])
    verdict = StalenessFilter(max_weight_staleness=2).screen(group, lambda _: 0)
    assert verdict.action is Action.DROP and verdict.rejection is Rejection.REWARD_ERROR
    assert verdict.reason == "reward_error"


def test_aborted_samples_are_not_scored():
    class Counting:
        calls: list[int] = []

        def score_group(self, prompt, responses):
            self.calls.append(len(responses))
            return [0.5] * len(responses)

    task = Counting()
    rewards, error = score_group(task, Prompt(0, (1,)), [[1], [2], [3]],
                                 [SampleStatus.ABORTED, SampleStatus.COMPLETED,
                                  SampleStatus.ABORTED])

    assert (rewards, error, task.calls) == ([0.0, 0.5, 0.0], None, [1])
