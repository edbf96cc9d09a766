"""The run's task, built once from its config: the seam between "your data, your reward" and
the built-in addition task.

:func:`run_task` returns a :class:`RunTask`: the engines' task (tokenizer + reward), the rollout
manager's prompt factory, the policy's vocabulary and context, and (data-set tasks) the data
set's identity. With no ``prompt_data`` it is the built-in :class:`~actors.task.AdditionTask`,
exactly as before (nothing is loaded). With ``prompt_data`` it loads and checks every row,
loads the tokenizer and the reward function, and renders every prompt once, so every bad input
(missing file, bad row, no tokenizer, a chat template that fails, an unimportable reward) is
a :class:`StartupError`, one line, before the ledger is touched.

Cached per process on the fields it depends on: ``launch.create_*`` calls it for every actor.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.errors import RewardErrorLimitError, StartupError

__all__ = [
    "RewardErrorLimitError",
    "RunTask",
    "EvalSet",
    "check_dataset_identity",
    "eval_sets",
    "reward_errors_end_the_run",
    "prepare",
    "run_task",
    "started_config",
]



_BUILTIN_CONTEXT = 16  # the built-in policy's context: "3+4=" and a few answer tokens


@dataclass(frozen=True)
class RunTask:
    """What the actors of a run need to know about its task."""

    engine_task: Any  # AdditionTask or DatasetTask: tokenizer + score_group
    make_prompt: Any  # index -> Prompt (picklable)
    vocab_size: int
    max_sequence_length: int
    dataset: dict[str, Any] | None = None  # DatasetIdentity.to_json(), data-set tasks only


def run_task(config: RunConfig) -> RunTask:
    """The run's task (cached on the task's fields).

    Raises:
        StartupError: the prompt data, tokenizer, template or reward cannot be used (one line).
    """
    key = (tuple(config.prompt_data), config.input_key, config.label_key, config.metadata_key,
           config.apply_chat_template, config.apply_chat_template_kwargs, config.rollout_shuffle,
           config.max_prompt_len, config.tokenizer, config.model, config.rm_type,
           config.custom_rm_path, config.seed, config.max_response_len,
           config.eval_max_response_len)
    if key not in _CACHE:
        _CACHE.clear()  # one run per process at a time: keep the newest only
        _CACHE[key] = _build_task(config)
    return _CACHE[key]


_CACHE: dict[tuple, RunTask] = {}


def _build_task(config: RunConfig) -> RunTask:
    if not config.prompt_data:
        from actors.task import TOKENIZER, AdditionTask

        return RunTask(AdditionTask(seed=config.seed),
                       functools.partial(_addition_prompt, config.seed),
                       TOKENIZER.vocab_size, _BUILTIN_CONTEXT)
    return _dataset_task(config)


def _addition_prompt(seed: int, index: int):
    from actors.task import AdditionTask

    return AdditionTask(seed=seed).make_prompt(index)


def _dataset_task(config: RunConfig) -> RunTask:
    from actors.dataset_task import DatasetTask
    from actors.rewards import RewardLoadError, reward_function
    from orchestrator.rollout.data.prompt_files import PromptDataError, load_prompt_rows
    from orchestrator.rollout.data.prompt_stream import DatasetPrompts
    from orchestrator.rollout.data.tokenizer import HFTokenizer, TokenizerError

    directory = config.tokenizer or config.model
    assert directory is not None  # RunConfig refuses prompt_data without either
    try:
        rows, identity = load_prompt_rows(config.prompt_data, config.input_key,
                                          config.label_key, config.metadata_key)
        # Absolute: the actors load it too, and a worker's directory is not the driver's.
        tokenizer = HFTokenizer(Path(directory).resolve()).check()
        prompts = DatasetPrompts(
            rows, identity, tokenizer, seed=config.seed, shuffle=config.rollout_shuffle,
            apply_chat_template=config.apply_chat_template,
            template_kwargs=config.template_kwargs, max_prompt_len=config.max_prompt_len)
        longest = prompts.longest_kept_prompt()
        kept = sum(1 for row in range(len(rows)) if config.max_prompt_len is None
                   or prompts.prompt_length(row) <= config.max_prompt_len)
        if kept == 0:
            raise PromptDataError(f"max_prompt_len: every one of the {len(rows)} prompts is "
                                  f"longer than {config.max_prompt_len} tokens")
        reward = reward_function(config.rm_type, config.custom_rm_path)
    except (PromptDataError, TokenizerError, RewardLoadError) as exc:
        raise StartupError(str(exc)) from None
    # The context holds the longest kept prompt and the longest response, train or eval.
    response = max(config.max_response_len, config.eval_max_response_len or 0)
    if config.model is not None:
        _check_model_context(Path(config.model), longest, response)
    return RunTask(DatasetTask(tokenizer, reward), prompts.make_prompt, tokenizer.vocab_size,
                   longest + response, identity.to_json())


def _check_model_context(model_dir: Path, longest_prompt: int, response: int) -> None:
    """Refuse a model whose context cannot hold the longest kept prompt and a response: an
    engine would refuse that prompt mid-run and end the run.

    Raises:
        StartupError: one line naming the limit and the options to lower.
    """
    import json

    try:
        context = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    except (OSError, ValueError, KeyError):
        return  # not a Llama-style config: the engine checks what it can serve
    if longest_prompt + response > int(context):
        raise StartupError(
            f"max_prompt_len: the longest kept prompt ({longest_prompt} tokens) and a response "
            f"of {response} exceed {model_dir}'s context of {context} tokens "
            "(max_position_embeddings); lower --max-prompt-len or --rollout-max-response-len")


def check_dataset_identity(ledger: Any, run_id: str, config: RunConfig) -> None:
    """Refuse to resume on other data than the run started with (or another seed/shuffle),
    as its ``run_started`` config records them; writes nothing. A run started without
    ``prompt_data`` may only resume without it.

    Raises:
        StartupError: the data set's digest, files' rows, seed or shuffle differ (one line).
        LedgerError: the ledger cannot be read.
    """
    recorded = next(ledger.events(run_id, 1, 1)).payload.get("config", {})
    task = run_task(config)
    before = recorded.get("dataset")
    if before is None and task.dataset is None:
        return
    if before is None or task.dataset is None:
        raise StartupError("refusing to resume: the run started "
                           + ("without" if before is None else "with") + " --prompt-data")
    for name in ("digest", "rows"):
        if before.get(name) != task.dataset[name]:
            raise StartupError(f"refusing to resume: the prompt data differ from the run's "
                               f"({name} {task.dataset[name]} != recorded {before.get(name)})")
    for name in ("seed", "rollout_shuffle"):
        if recorded.get(name) != getattr(config, name):
            raise StartupError(f"refusing to resume: {name} {getattr(config, name)} != the "
                               f"run's {recorded.get(name)} (the prompt order would change)")



def prepare(config: RunConfig) -> RunConfig:
    """Check the task before anything is written; with ``num_epoch``, the config with
    ``num_rollout = num_epoch * rows // rollout_batch_size`` (at least 1), as miles sets it.

    Raises:
        StartupError: see :func:`run_task`.
    """
    task = run_task(config)
    eval_sets(config)
    if config.num_epoch is None or task.dataset is None:
        return config
    steps = max(1, config.num_epoch * task.dataset["total_rows"] // config.rollout_batch_size)
    return config.model_copy(update={"num_rollout": steps})


def started_config(config: RunConfig) -> dict[str, Any]:
    """The config ``run_started`` records: every option, plus ``dataset`` (files, rows per
    file, total rows, content digest) for a data-set task."""
    dataset = run_task(config).dataset
    return {**config.model_dump(mode="json"), **({"dataset": dataset} if dataset else {})}


@contextmanager
def reward_errors_end_the_run() -> Iterator[None]:
    """Around a drain: the rollout manager's :class:`RewardErrorsExceededError` (raised
    through Ray) becomes :class:`RewardErrorLimitError`, one line, which ends the run."""
    from orchestrator.rollout.errors import RewardErrorsExceededError

    try:
        yield
    except RewardErrorsExceededError as exc:  # Ray's RayTaskError is an instance of its cause
        cause = getattr(exc, "cause", exc)
        raise RewardErrorLimitError(str(cause)) from None


@dataclass(frozen=True)
class EvalSet:
    """One eval set: its prompts (those within ``max_prompt_len``) and content digest."""

    prompts: tuple[Any, ...]
    digest: str


def eval_sets(config: RunConfig) -> dict[str, EvalSet]:
    """The run's eval sets by name, read and rendered like its prompt data (cached).

    Raises:
        StartupError: a file, row, template or length problem (one line).
    """
    key = ("eval", tuple(config.eval_prompt_data), config.input_key, config.label_key,
           config.apply_chat_template, config.max_prompt_len, config.tokenizer or config.model)
    if key not in _EVAL_CACHE:
        _EVAL_CACHE[key] = _load_eval_sets(config)
    return _EVAL_CACHE[key]


_EVAL_CACHE: dict[tuple, dict[str, EvalSet]] = {}


def _load_eval_sets(config: RunConfig) -> dict[str, EvalSet]:
    from orchestrator.rollout.data.prompt_files import PromptDataError, load_prompt_rows
    from orchestrator.rollout.data.prompt_stream import DatasetPrompts
    from orchestrator.rollout.data.tokenizer import TokenizerError

    sets = {}
    tokenizer = run_task(config).engine_task.tokenizer if config.eval_prompt_data else None
    for name, path in config.eval_sets:
        try:
            rows, identity = load_prompt_rows([path], config.input_key, config.label_key,
                                              config.metadata_key)
            stream = DatasetPrompts(
                rows, identity, tokenizer, seed=config.seed, shuffle=False,
                apply_chat_template=config.apply_chat_template,
                template_kwargs=config.template_kwargs, max_prompt_len=config.max_prompt_len)
            prompts = tuple(prompt for prompt in map(stream.make_prompt, range(len(rows)))
                            if prompt.drop_reason is None)
        except (PromptDataError, TokenizerError) as exc:
            raise StartupError(f"eval_prompt_data {name}: {exc}") from None
        sets[name] = EvalSet(prompts, identity.digest)
    return sets
