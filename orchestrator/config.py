"""RunConfig: every option of a run, validated once, at load.

Option names follow miles (``max_weight_staleness``, ``async_unused_samples_handler``, ...) so a
miles user recognises them; defaults suit a short CPU run. Every field has a ``description``:
it is the field's help text in ``orchestrator run --help``, where each field is a flag
(:mod:`orchestrator.cli`).

A config is frozen: code that needs a variant builds a new one with ``model_copy(update=...)``
(which does not re-validate) or, better, :meth:`RunConfig.from_yaml` / ``RunConfig(**fields)``.
Checks that span fields (``rollout_batch_size >= num_cells``) live in the model too, so every
way of building a config refuses the same combinations.

Invalid values fail at load with :class:`ConfigError`, a one-line ``ValueError`` that names the
field (or the unreadable file), so a CLI can print it and exit 2.

Where the ledger lives when ``db`` is unset is a run convention, not an option: see
:func:`ledger.run_layout.default_ledger_url`.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.device_config import DeviceOptions
from orchestrator.errors import ConfigError
from orchestrator.task_options import TaskOptions

__all__ = ["ALIASES", "ConfigError", "RunConfig", "Tracker"]

_RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

ALIASES: dict[str, tuple[str, ...]] = {
    "max_response_len": ("rollout_max_response_len",),
    "max_prompt_len": ("rollout_max_prompt_len",),
}
"""Field -> the other names it answers to (miles' flags), as flags and as config keys."""
_ALIAS_OF = {alias: name for name, aliases in ALIASES.items() for alias in aliases}


class Tracker(enum.StrEnum):
    """An experiment tracker a run can log to (``--tracker``, repeatable)."""

    NONE = "none"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"



class RunConfig(DeviceOptions, TaskOptions):
    """All options of one run. Frozen; unknown keys are refused. The device options
    (``device``, ``dtype``, GPUs per actor) come from :class:`DeviceOptions`, the task's
    (prompt data, reward, evaluation) from :class:`TaskOptions`.

    Build with ``RunConfig(**fields)`` (raises pydantic ``ValidationError``) or
    :meth:`from_yaml` (raises :class:`ConfigError`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # Identity and storage.
    run_id: str | None = Field(
        default=None,
        description="run id, also the run's directory name (default: run-<time>-<random>)",
    )
    db: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the ledger (default: the run directory's own SQLite "
                    "file)",
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="absolute path or fsspec URL (file://, s3://, ...) where checkpoints and "
                    "rollout-manager states go; on a cluster, storage every node reads "
                    "(default: <run directory>/checkpoints, absolute)",
    )

    # Rollout shape.
    rollout_batch_size: int = Field(
        default=16, ge=1, description="prompt groups trained per step (at least num_cells)"
    )
    n_samples_per_prompt: int = Field(default=8, ge=1, description="samples per prompt group")
    max_weight_staleness: int | None = Field(
        default=1, ge=0,
        description="max version lag of a trained group; null in --config turns it off",
    )
    async_unused_samples_handler: Literal["drop", "retry"] = Field(
        default="retry", description="what happens to a group past max_weight_staleness"
    )
    async_data_buffer_capacity_factor: int = Field(
        default=2, ge=1, description="the data buffer holds factor * rollout_batch_size groups"
    )
    async_max_concurrent_samples: int = Field(
        default=16, ge=1, description="prompt groups generating at once"
    )
    engine_call_max_groups: int = Field(
        default=8, ge=1,
        description="prompt groups in one call to an engine at most: the rollout manager "
                    "sends the groups it starts together to an engine as one call and gets "
                    "them back as one answer; 1: a call per group",
    )
    max_recycles: int = Field(
        default=3, ge=0, description="times a stale group is recycled before it is dropped"
    )
    partial_rollout: bool = Field(
        default=True,
        description="partial rollout (pause mode in_place): a weight update pauses engines "
                    "between tokens and in-flight samples continue under the new weights, each "
                    "token stamped with its version; off: the update aborts them (pause mode "
                    "abort) and they are regenerated",
    )
    weight_swap: Literal["pause", "in-flight"] = Field(
        default="in-flight",
        description="how engines take a weight update: in-flight (PipelineRL's in-flight "
                    "updates): they receive the weights while they generate and swap them in "
                    "at their next token boundary after the ledger's commit; pause: they stop "
                    "for the whole transfer and commit",
    )
    max_partial_span: int | None = Field(
        default=None, ge=0,
        description="recycle (retry) or drop a group with a sample whose tokens span more "
                    "than this many versions (newest - oldest); unset: no limit",
    )

    # Topology.
    num_cells: int = Field(default=2, ge=1, description="training cells (independent replicas)")
    num_engines: int = Field(default=2, ge=1, description="rollout engines")
    placement: Literal["spread", "pack"] = Field(
        default="spread",
        description="spread: each cell (and engine) on its own node where there are enough "
                    "(placement group STRICT_SPREAD, else SPREAD with a warning); pack: as few "
                    "nodes as possible",
    )
    rendezvous_host: str | None = Field(
        default=None,
        description="address the cells reach the gradient rendezvous store at (default: the "
                    "driver node's Ray IP)",
    )

    # Schedule.
    num_rollout: int = Field(default=100, ge=1, description="training steps")
    update_weights_interval: int = Field(
        default=1, ge=1, description="publish weights to the engines every N steps"
    )
    save_interval: int = Field(default=10, ge=1, description="checkpoint every N steps")
    seed: int = Field(default=1234, ge=0, description="seed of the task, model and sampling")

    # Training and weight transport.
    backend: Literal["megatron", "torch", "hf"] = Field(
        default="torch",
        description="trainer backend of the cells (and of builtin engines): torch, megatron, or "
                    "hf (a transformers Llama, with --engine vllm); with --engine vllm, "
                    "megatron builds a GPTModel as a Llama, published under HF names",
    )
    engine: Literal["builtin", "vllm"] = Field(
        default="builtin",
        description="rollout engine: the builtin sampler, or vLLM (pip install -e '.[vllm]'; "
                    "with --backend hf or megatron)",
    )
    model: str | None = Field(
        default=None,
        description="local save_pretrained directory of a Llama for --engine vllm whose "
                    "tokenizer speaks the task's symbols (default: a tiny random one made for "
                    "the task under the run directory; nothing is downloaded)",
    )
    transport: Literal["full", "lora"] = Field(
        default="full", description="weights a publish sends: all parameters or the LoRA adapter"
    )
    lr: float = Field(default=3e-3, gt=0.0, le=1.0, description="learning rate")
    lora_rank: int = Field(
        default=8, ge=1, description="rank of the LoRA adapters (with --transport lora)"
    )
    lora_alpha: float = Field(
        default=16.0, gt=0.0,
        description="LoRA scale numerator: adapter output is scaled by alpha / rank",
    )
    lora_lr: float = Field(
        default=5e-3, gt=0.0, le=1.0,
        description="learning rate of the LoRA adapters (with --transport lora; --lr is for "
                    "full weights)",
    )
    # The two clips bound the ratio to [1 - eps_clip, 1 + eps_clip_high]: each is a bound of
    # its own, so no ordering between them is enforced (a tighter upper clip is legitimate).
    eps_clip: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="lower PPO clip: ratio >= 1 - eps_clip"
    )
    eps_clip_high: float = Field(
        default=0.28, gt=0.0, lt=1.0, description="upper PPO clip: ratio <= 1 + eps_clip_high"
    )
    eps_clip_c: float | None = Field(
        default=3.0, gt=1.0,
        description="dual clip (verl's clip_ratio_c): a token with a negative advantage adds at "
                    "most eps_clip_c * |advantage| to the loss, however far off-policy it is; "
                    "null in --config turns it off",
    )
    off_policy_correction: Literal["none", "decoupled", "tis"] = Field(
        default="none",
        description="how the loss corrects for tokens sampled by older weights: none (PPO ratio "
                    "against the engine's log-probs), decoupled (AReaL: PPO ratio against the "
                    "trainer's weights at the start of the step, times the behaviour importance "
                    "weight truncated at --tis-cap), tis (miles' --use-tis: the same, weight "
                    "clamped into [--tis-clip-low, --tis-cap])",
    )
    tis_cap: float = Field(
        default=5.0, ge=1.0,
        description="upper bound of the behaviour importance weight (decoupled and tis)",
    )
    tis_clip_low: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="lower bound of the behaviour importance weight (tis only)",
    )

    # Sampling.
    temperature: float = Field(default=1.0, gt=0.0, description="sampling temperature")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    max_response_len: int = Field(
        default=3, ge=1,
        description="new tokens per response; a response "
                    "that reaches it without EOS is truncated (counted, earns the reward of its "
                    "text so far)",
    )

    # Liveness and mode.
    heartbeat_timeout_s: float = Field(
        default=10.0, gt=0.0, description="seconds without a heartbeat before a cell is dead"
    )
    max_restarts: int = Field(
        default=10, ge=1, description="actor replacements (cells healed, engines restarted, "
                                      "managers replaced) allowed within 10 minutes; one more "
                                      "ends the run",
    )
    sync: bool = Field(
        default=False, description="generate only while the trainer waits (no overlap)"
    )

    # Experiment tracking.
    tracker: list[Tracker] = Field(
        default=[],
        description="where metrics go besides metrics.jsonl, repeatable: none, tensorboard "
                    "(event files under the run directory), wandb (offline unless WANDB_MODE "
                    "says otherwise); pip install -e '.[tracking]'",
    )

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, value: str | None) -> str | None:
        # The run id becomes a directory name and a ledger key: keep it path-safe.
        if value is not None and not _RUN_ID_PATTERN.match(value):
            raise ValueError(
                "must be 1-128 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("db")
    @classmethod
    def _check_db(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError("must be a SQLAlchemy URL such as sqlite:///runs/x/ledger.db")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _check_checkpoint_dir(cls, value: str | None) -> str | None:
        # Resolved in each actor's working directory, a relative path means another place on
        # every node: only an absolute path or a URL names one place for all of them.
        if value is not None and "://" not in value and not Path(value).is_absolute():
            raise ValueError("must be an absolute path or an fsspec URL such as "
                             "file:///shared/ckpt or s3://bucket/ckpt")
        return value

    @model_validator(mode="after")
    def _check_topology(self) -> RunConfig:
        # Each step's batch is split across the alive cells: a cell with no group would have no
        # gradient to contribute to the step's average.
        if self.rollout_batch_size < self.num_cells:
            raise ValueError(
                f"rollout_batch_size: {self.rollout_batch_size} cannot feed {self.num_cells} "
                "cells: every cell needs at least one group per step"
            )
        return self

    @model_validator(mode="after")
    def _check_engine(self) -> RunConfig:
        # vLLM serves Llama checkpoints (HF names); the built-in engine builds the GPT policy.
        if self.engine == "vllm" and self.backend == "torch":
            raise ValueError("backend: --engine vllm serves a Llama checkpoint: use --backend "
                             "hf or megatron")
        if self.engine == "builtin" and (self.backend == "hf" or self.model is not None):
            raise ValueError("engine: --backend hf and --model need --engine vllm")
        if Tracker.NONE in self.tracker and len(set(self.tracker)) > 1:
            raise ValueError("tracker: 'none' cannot be combined with a tracker")
        return self

    @property
    def buffer_capacity(self) -> int:
        """Groups the data buffer holds before the producer blocks."""
        return self.async_data_buffer_capacity_factor * self.rollout_batch_size

    @classmethod
    def from_yaml(
        cls, path: str | Path | None, overrides: dict[str, Any] | None = None
    ) -> RunConfig:
        """Load a config from a YAML mapping, then apply ``overrides`` on top.

        ``path`` None means defaults plus overrides. Keys may use ``-`` or ``_``
        (``max-weight-staleness`` is ``max_weight_staleness``). Override values that are None
        are ignored, so a CLI can pass every option it defines, set or not; to turn an option
        off (``max_weight_staleness: null``) say so in the file.

        Raises:
            ConfigError: the file cannot be read or parsed, is not a mapping, has an unknown
                key, or a value (or a combination of values) is invalid. The message is one
                line naming the field or file.
        """
        fields = _read_yaml_mapping(Path(path)) if path is not None else {}
        fields.update(
            (_normalise_key(key), value)
            for key, value in (overrides or {}).items()
            if value is not None
        )
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None


def _normalise_key(key: object) -> str:
    name = str(key).replace("-", "_")
    return _ALIAS_OF.get(name, name)


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{path}: invalid YAML: {detail}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: config must be a mapping of option: value, got {type(loaded).__name__}"
        )
    return {_normalise_key(key): value for key, value in loaded.items()}


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown option")
        elif not field:
            # A cross-field check: its message already names the field it blames.
            parts.append(str(error.get("ctx", {}).get("error", error["msg"])))
        else:
            parts.append(f"{field}: {error['msg']} (got {error.get('input')!r})")
    return "; ".join(parts)
