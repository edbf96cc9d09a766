"""RunConfig: every option of a run, validated once, at load.

Option names follow miles (``max_weight_staleness``, ``async_unused_samples_handler``,
``indep_dp``, ...) so a miles user recognises them; defaults suit a short CPU run. A config is
frozen: code that needs a variant builds a new one with ``model_copy(update=...)`` (which does
not re-validate) or, better, :meth:`RunConfig.from_yaml` / ``RunConfig(**fields)``.

Invalid values fail at load with :class:`ConfigError`, a one-line ``ValueError`` that names the
field (or the unreadable file), so a CLI can print it and exit 2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["ConfigError", "RunConfig"]

_RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ConfigError(ValueError):
    """A config that cannot be loaded: unreadable file, unknown key, or invalid value.

    The message is one line and names the field (``max_weight_staleness: ...``) or the file.
    """


class RunConfig(BaseModel):
    """All options of one run. Frozen; unknown keys are refused.

    Build with ``RunConfig(**fields)`` (raises pydantic ``ValidationError``) or
    :meth:`from_yaml` (raises :class:`ConfigError`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # Identity and storage.
    run_id: str | None = None
    db: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the ledger; None means sqlite:///runs/<run-id>/ledger.db",
    )

    # Rollout shape.
    rollout_batch_size: int = Field(default=16, ge=1, description="prompt groups per step")
    n_samples_per_prompt: int = Field(default=8, ge=1)
    max_weight_staleness: int | None = Field(
        default=2, ge=0, description="max version lag of a trained group; None = off"
    )
    async_unused_samples_handler: Literal["drop", "retry"] = "retry"
    async_data_buffer_capacity_factor: int = Field(
        default=2, ge=1, description="buffer holds factor * rollout_batch_size groups"
    )
    async_max_concurrent_samples: int = Field(default=16, ge=1, description="groups in flight")
    max_recycles: int = Field(default=3, ge=0)

    # Topology.
    indep_dp: bool = True
    num_cells: int = Field(default=2, ge=1)
    num_engines: int = Field(default=2, ge=1)

    # Schedule.
    num_rollout: int = Field(default=100, ge=1, description="training steps")
    update_weights_interval: int = Field(default=1, ge=1)
    save_interval: int = Field(default=10, ge=1)
    seed: int = Field(default=1234, ge=0)

    # Training and weight transport.
    backend: Literal["megatron", "torch"] = "torch"
    transport: Literal["full", "lora"] = "full"
    lr: float = Field(default=3e-3, gt=0.0, le=1.0)
    eps_clip: float = Field(default=0.2, gt=0.0, lt=1.0, description="lower PPO clip")
    eps_clip_high: float = Field(default=0.28, gt=0.0, lt=1.0, description="upper PPO clip")

    # Sampling.
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_response_len: int = Field(default=3, ge=1, description="new tokens per response")

    # Liveness and mode.
    heartbeat_timeout_s: float = Field(default=10.0, gt=0.0)
    sync: bool = False

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

    @property
    def buffer_capacity(self) -> int:
        """Groups the data buffer holds before the producer blocks."""
        return self.async_data_buffer_capacity_factor * self.rollout_batch_size

    def db_url(self, run_id: str | None = None) -> str:
        """The ledger URL: ``db`` if set, else ``sqlite:///runs/<run-id>/ledger.db``.

        ``run_id`` overrides the config's own (useful when the CLI generates one).

        Raises:
            ConfigError: neither ``db`` nor a run id is known.
        """
        if self.db is not None:
            return self.db
        run_id = run_id or self.run_id
        if run_id is None:
            raise ConfigError(
                "db: not set and no run_id to derive sqlite:///runs/<run-id>/ledger.db"
            )
        return f"sqlite:///runs/{run_id}/ledger.db"

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
                key, or a value is invalid. The message is one line naming the field or file.
        """
        fields: dict[str, Any] = {}
        if path is not None:
            fields.update(_read_yaml_mapping(Path(path)))
        for key, value in (overrides or {}).items():
            if value is not None:
                fields[_normalise_key(key)] = value
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None


def _normalise_key(key: object) -> str:
    return str(key).replace("-", "_")


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        loaded = yaml.safe_load(text)
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
        field = ".".join(str(part) for part in error["loc"]) or "config"
        if error["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown option")
            continue
        parts.append(f"{field}: {error['msg']} (got {error.get('input')!r})")
    return "; ".join(parts)
