"""TaskOptions: the options of a run's task (prompt data, reward, evaluation), miles' names.

A part of :class:`orchestrator.config.RunConfig` (its base class), kept in a module of its own
so each stays small; the checks that need the engine options (``engine``, ``model``) run on the
whole RunConfig, which has them. Field meanings are their ``description`` (the flags' help).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

__all__ = ["TaskOptions"]

_REWARD_PATH_PATTERN = re.compile(r"^[A-Za-z_][\w.]*[.:][A-Za-z_]\w*$")


class TaskOptions(BaseModel):
    """The task's options; see :class:`orchestrator.config.RunConfig` for how a config is built
    and validated (this class is never used alone)."""

    # Task: prompt data and reward (miles' names). Unset prompt_data: the addition task.
    prompt_data: list[str] = Field(
        default=[],
        description="JSONL or Parquet file(s) of prompts, repeatable, local only (default: the addition "
                    "task); needs --tokenizer or --model",
    )
    input_key: str = Field(
        default="prompt",
        description="row key of the prompt: a string, or a list of chat messages {role, content}",
    )
    label_key: str | None = Field(
        default="label", description="row key of the reference answer the reward compares with",
    )
    metadata_key: str | None = Field(
        default="metadata", description="row key of a mapping handed to the reward as metadata",
    )
    apply_chat_template: bool = Field(
        default=False,
        description="render each prompt with the tokenizer's own chat template (a string "
                    "prompt becomes one user message)",
    )
    apply_chat_template_kwargs: str | None = Field(
        default=None, description="JSON object of extra keyword arguments to the chat template",
    )
    rollout_shuffle: bool = Field(
        default=False,
        description="shuffle the rows of each epoch with the run seed (deterministic per epoch)",
    )
    num_epoch: int | None = Field(
        default=None, ge=1,
        description="passes over --prompt-data; sets the steps to num_epoch * rows // "
                    "rollout_batch_size (miles' rule), overriding --num-rollout",
    )
    max_prompt_len: int | None = Field(
        default=None, ge=1,
        description="prompts longer than this many tokens are dropped, counted as too_long "
                    "(default: the longest prompt of the data sets the model's length)",
    )
    tokenizer: str | None = Field(
        default=None,
        description="local Hugging Face tokenizer directory for --prompt-data with the built-in "
                    "engine (default: the --model directory's tokenizer)",
    )
    rm_type: Literal["exact", "math", "boxed"] = Field(
        default="math",
        description="reward of --prompt-data: exact (normalised string match), math (the "
                    "math_verify package), boxed (the boxed answer, matched with math_verify)",
    )
    custom_rm_path: str | None = Field(
        default=None,
        description="module.function (or module:function) of your own reward, sync or async, "
                    "called as f(prompt, response, label, metadata) -> float; overrides "
                    "--rm-type",
    )
    reward_error_limit: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="end the run (run_failed) when more than this fraction of a step's groups "
                    "were dropped as reward_error (a reward function that raised)",
    )

    # Evaluation (miles' names): between train steps, on the engines, outside the rollout.
    eval_prompt_data: list[str] = Field(
        default=[],
        description="eval sets as NAME PATH pairs, read like the prompt data (on the command "
                    "line the flag is given twice per set: once the name, once the path)",
    )
    eval_interval: int | None = Field(
        default=None, ge=1, description="evaluate every N steps (and after the last one)",
    )
    n_samples_per_eval_prompt: int = Field(
        default=1, ge=1, description="samples per eval prompt (pass@k is over these k)",
    )
    eval_max_response_len: int | None = Field(
        default=None, ge=1,
        description="new tokens per eval response (default: max_response_len)",
    )

    @field_validator("apply_chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                loaded = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"must be a JSON object: {exc.msg}") from None
            if not isinstance(loaded, dict):
                raise ValueError("must be a JSON object such as {\"enable_thinking\": false}")
        return value

    @field_validator("custom_rm_path")
    @classmethod
    def _check_custom_rm_path(cls, value: str | None) -> str | None:
        if value is not None and not _REWARD_PATH_PATTERN.match(value):
            raise ValueError("must be module.function or module:function")
        return value

    @model_validator(mode="after")
    def _check_task(self) -> TaskOptions:
        engine, model = getattr(self, "engine"), getattr(self, "model")  # RunConfig's fields
        # The addition task has its own symbols; a data set needs a tokenizer for its text.
        if not self.prompt_data:
            for name in ("num_epoch", "tokenizer", "custom_rm_path", "max_prompt_len"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: needs --prompt-data (the built-in addition task "
                                     "has its own)")
            return self
        if engine == "builtin" and self.tokenizer is None:
            raise ValueError("tokenizer: --prompt-data with the built-in engine needs "
                             "--tokenizer DIR (a local Hugging Face tokenizer directory)")
        if engine == "vllm" and model is None:
            raise ValueError("model: --prompt-data with --engine vllm needs --model DIR (the "
                             "tiny model made for the addition task cannot read your data)")
        return self

    @model_validator(mode="after")
    def _check_eval(self) -> TaskOptions:
        if len(self.eval_prompt_data) % 2:
            raise ValueError("eval_prompt_data: give NAME PATH pairs")
        if self.eval_prompt_data and (not self.prompt_data or self.eval_interval is None):
            raise ValueError("eval_prompt_data: needs --prompt-data (its tokenizer and "
                             "reward) and --eval-interval")
        return self

    @property
    def eval_sets(self) -> list[tuple[str, str]]:
        """``eval_prompt_data`` as (name, path) pairs."""
        data = self.eval_prompt_data
        return list(zip(data[::2], data[1::2]))

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """``apply_chat_template_kwargs`` as a mapping ({} when unset)."""
        return json.loads(self.apply_chat_template_kwargs or "{}")
