"""The toy task: deterministic prompts, a round-tripping tokenizer, an exact reward."""

from __future__ import annotations

import pytest

from actors.task import TOKENIZER, AdditionTask


def test_prompts_are_deterministic_per_seed_and_index() -> None:
    task = AdditionTask(seed=3)

    assert task.make_prompt(17) == AdditionTask(seed=3).make_prompt(17)
    assert [task.make_prompt(i) for i in range(50)] != [
        AdditionTask(seed=4).make_prompt(i) for i in range(50)
    ]


def test_prompt_encodes_operands_and_label_is_their_sum() -> None:
    task = AdditionTask(seed=0, max_operand=4)

    for index in range(100):
        prompt = task.make_prompt(index)
        left, right = task.operands(index)
        assert prompt.index == index
        assert TOKENIZER.decode(prompt.tokens) == f"{left}+{right}="
        assert prompt.label == str(left + right)
        assert 0 <= left <= 4 and 0 <= right <= 4


def test_tokenizer_round_trips_and_stops_at_eos() -> None:
    tokens = TOKENIZER.encode("12+7=19")

    assert TOKENIZER.decode(tokens) == "12+7=19"
    with_eos = [*TOKENIZER.encode("4"), TOKENIZER.eos_id, *TOKENIZER.encode("5")]
    assert TOKENIZER.decode(with_eos) == "4"
    with pytest.raises(ValueError):
        TOKENIZER.encode("x")


def test_reward_is_exact_with_smaller_partial_credit() -> None:
    task = AdditionTask(seed=0)
    prompt = next(p for p in map(task.make_prompt, range(100)) if p.label == "5")
    eos = TOKENIZER.eos_id

    exact = task.reward(prompt, [*TOKENIZER.encode("5"), eos])
    close = task.reward(prompt, [*TOKENIZER.encode("6"), eos])
    far = task.reward(prompt, [*TOKENIZER.encode("12"), eos])

    assert exact == 1.0
    assert 0.1 < close < 1.0
    assert far == pytest.approx(task.format_credit)
    assert task.reward(prompt, TOKENIZER.encode("5")) == 0.0  # no EOS: truncated
    assert task.reward(prompt, [eos]) == 0.0  # empty answer
    assert task.reward(prompt, [*TOKENIZER.encode("+5"), eos]) == 0.0  # not digits


def test_invalid_task_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        AdditionTask(max_operand=10)
    with pytest.raises(ValueError):
        AdditionTask(format_credit=0.5, closeness_credit=0.6)
    with pytest.raises(ValueError):
        AdditionTask().make_prompt(-1)
