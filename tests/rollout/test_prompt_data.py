"""Prompt data: JSONL and Parquet rows, their checks, the data set's identity, and the prompt
stream (position -> (epoch, row), shuffle, chat template, too_long)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.rollout.data.prompt_files import PromptDataError, load_prompt_rows
from orchestrator.rollout.data.prompt_stream import TOO_LONG, DatasetPrompts
from orchestrator.rollout.data.tokenizer import HFTokenizer, TokenizerError
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from tests.task_fixtures import addition_rows, make_tokenizer, write_jsonl, write_parquet


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> HFTokenizer:
    return HFTokenizer(make_tokenizer(tmp_path_factory.mktemp("tok"))).check()


def _load(*paths: Path, label_key: str | None = "label"):
    return load_prompt_rows([str(p) for p in paths], "prompt", label_key, "metadata")


def _stream(rows, identity, tokenizer, **overrides) -> DatasetPrompts:
    options = dict(seed=7, shuffle=False, apply_chat_template=False, template_kwargs={},
                   max_prompt_len=None)
    options.update(overrides)
    return DatasetPrompts(rows, identity, tokenizer, **options)


def test_jsonl_and_parquet_files_load_in_order_with_labels_and_metadata(tmp_path: Path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", addition_rows(3))
    parquet = write_parquet(tmp_path / "b.parquet", addition_rows(2, offset=3))

    rows, identity = _load(jsonl, parquet)

    assert [row.input for row in rows] == ["0+0=", "1+0=", "2+0=", "3+0=", "4+0="]
    assert [row.label for row in rows] == ["0", "1", "2", "3", "4"]
    assert rows[4].metadata == {"n": 4}
    assert identity.rows == (3, 2) and identity.total_rows == 5
    assert identity.files == (str(jsonl.resolve()), str(parquet.resolve()))


def test_the_digest_names_the_content_not_the_file(tmp_path: Path):
    _, first = _load(write_jsonl(tmp_path / "a.jsonl", addition_rows(4)))
    _, same = _load(write_jsonl(tmp_path / "copy.jsonl", addition_rows(4)))
    changed = addition_rows(4)
    changed[2]["label"] = "9"
    _, other = _load(write_jsonl(tmp_path / "b.jsonl", changed))

    assert first.digest == same.digest
    assert other.digest != first.digest


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "1+1=", "label": "2"}', '{"prompt": "2+2="}'],
     "row 2: no 'label' (--label-key)"),
    (['{"label": "2"}'], "row 1: no 'prompt' (--input-key)"),
    (['{"prompt": "1+1=", "label": "2"}', '{"prompt": "2+2=", "label": '],
     "row 2: unreadable JSON"),
    (['{"prompt": 5, "label": "2"}'], "row 1: 'prompt' must be a string or a list"),
    (['{"prompt": "1+1=", "label": "2", "metadata": [1]}'], "row 1: 'metadata' must be a"),
])
def test_a_bad_row_is_named_in_one_line(tmp_path: Path, lines: list[str], message: str):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")

    with pytest.raises(PromptDataError) as raised:
        _load(path)

    assert message in str(raised.value)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_file_and_an_unknown_format_are_refused(tmp_path: Path):
    with pytest.raises(PromptDataError, match="no such file"):
        _load(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("prompt,label\n")
    with pytest.raises(PromptDataError, match="unknown format"):
        _load(tmp_path / "rows.csv")


def test_chat_messages_are_rendered_with_the_tokenizers_own_template(tmp_path: Path,
                                                                      tokenizer: HFTokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", [
        {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2="}],
         "label": "3"},
        {"prompt": "2+2=", "label": "4"},
    ])
    rows, identity = _load(path)
    stream = _stream(rows, identity, tokenizer, apply_chat_template=True)

    chat, plain = stream.make_prompt(0), stream.make_prompt(1)

    assert chat.text == "[system]Add.\n[user]1+2=\n[assistant]"
    assert plain.text == "[user]2+2=\n[assistant]"  # a string becomes one user message
    assert tokenizer.decode(list(chat.tokens)) == chat.text
    assert chat.label == "3"


def test_a_tokenizer_without_a_template_is_refused_when_one_is_asked_for(tmp_path: Path):
    from orchestrator.rollout.data.tokenizer import build_char_tokenizer

    bare = HFTokenizer(build_char_tokenizer(tmp_path / "bare", "0123456789+=")).check()
    rows, identity = _load(write_jsonl(tmp_path / "a.jsonl", addition_rows(2)))

    with pytest.raises(TokenizerError, match="no chat template"):
        _stream(rows, identity, bare, apply_chat_template=True).longest_kept_prompt()


def test_a_prompt_over_max_prompt_len_keeps_its_place_and_is_marked_too_long(
        tmp_path: Path, tokenizer: HFTokenizer):
    rows, identity = _load(write_jsonl(tmp_path / "a.jsonl", [
        {"prompt": "1+1=", "label": "2"}, {"prompt": "11+11+11=", "label": "33"}]))
    stream = _stream(rows, identity, tokenizer, max_prompt_len=5)

    assert stream.make_prompt(0).drop_reason is None
    assert stream.make_prompt(1).drop_reason == TOO_LONG
    assert stream.longest_kept_prompt() == 4


def test_the_data_buffer_settles_a_too_long_prompt_as_dropped_and_hands_out_the_next(
        tmp_path: Path, tokenizer: HFTokenizer):
    rows, identity = _load(write_jsonl(tmp_path / "a.jsonl", [
        {"prompt": "11+11+11=", "label": "33"}, {"prompt": "1+1=", "label": "2"}]))
    stream = _stream(rows, identity, tokenizer, max_prompt_len=5)
    buffer = DataBuffer(capacity=4)

    prompt, _ = buffer.take_prompt(PromptSource(stream.make_prompt))

    assert prompt.index == 1
    assert buffer.dropped_prompts() == {0: TOO_LONG}
    assert buffer.accounting().balanced


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), seed=st.integers(0, 10**6), epochs=st.integers(1, 3),
       shuffle=st.booleans())
def test_every_row_appears_exactly_once_per_epoch_in_a_deterministic_order(
        rows: int, seed: int, epochs: int, shuffle: bool):
    from orchestrator.rollout.data.prompt_files import DatasetIdentity, PromptRow

    data = [PromptRow(str(index), str(index)) for index in range(rows)]
    identity = DatasetIdentity(("x",), (rows,), "sha256:x")
    stream = DatasetPrompts(data, identity, HFTokenizer("unused"), seed=seed, shuffle=shuffle,
                            apply_chat_template=False, template_kwargs={}, max_prompt_len=None)
    again = pickle.loads(pickle.dumps(stream))  # what the rollout manager actor gets

    for epoch in range(epochs):
        positions = range(epoch * rows, (epoch + 1) * rows)
        mapped = [stream.epoch_row(position) for position in positions]
        assert {e for e, _ in mapped} == {epoch}
        assert sorted(row for _, row in mapped) == list(range(rows))
        assert [again.epoch_row(position) for position in positions] == mapped
        if not shuffle:
            assert [row for _, row in mapped] == list(range(rows))
