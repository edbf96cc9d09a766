"""Contracts between rollout engines, the rollout path, the control plane and the trainer.

Data (``Prompt``, ``Sample``, ``Group``, the rollout function's input and output) and the two
interfaces the rollout path is given from outside: the :class:`EnginePool` it generates with
and the :class:`RolloutConfig` it is shaped by (``orchestrator.config.RunConfig`` satisfies
it). Imports nothing but the standard library and :mod:`orchestrator.rollout.errors`, so actors
import this module without pulling in the ledger or Ray.

Weight versions are plain ``int`` end to end: engines start at version 0 (the weights they are
launched with) and are stamped with the versions the ledger commits. A label that is not an
integer (``"default"``, ``"57"``, ``True``, ``None``) is rejected where it enters, with
:class:`VersionLabelError`, instead of being compared as a string later.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from orchestrator.rollout.errors import VersionLabelError

__all__ = [
    "EnginePool",
    "Group",
    "GroupRequest",
    "Prompt",
    "PromptPosition",
    "ReplaceableEnginePool",
    "RolloutConfig",
    "RolloutFnTrainInput",
    "RolloutFnTrainOutput",
    "Sample",
    "SampleStatus",
    "VersionLabelError",
    "check_weight_version",
]


def check_weight_version(label: object) -> int:
    """Return ``label`` as a weight version, or raise :class:`VersionLabelError`.

    ``bool`` is refused although it subclasses ``int``: ``True`` is never a version.
    """
    if isinstance(label, bool) or not isinstance(label, int):
        raise VersionLabelError(
            f"weight version must be an int, got {type(label).__name__} {label!r}"
        )
    if label < 0:
        raise VersionLabelError(f"weight version must be >= 0, got {label}")
    return label


class SampleStatus(str, enum.Enum):
    """How a generation ended."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(frozen=True)
class Prompt:
    """One prompt of the task: its position in the prompt source, tokens and expected answer.

    ``index`` is the prompt's position in its seeded source, so a prompt can be regenerated
    from it and a saved source position names exactly which prompts were handed out. ``text``
    (the prompt as the model reads it) and ``metadata`` (the data row's) go to the reward.
    A prompt with a ``drop_reason`` (``too_long``) is settled as dropped when it is taken,
    never generated: it still takes its place in the stream, so every row is accounted for.
    """

    index: int
    tokens: tuple[int, ...]
    label: str = ""
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    drop_reason: str | None = None


@dataclass
class Sample:
    """One response to one prompt, stamped with the weight versions that produced it.

    ``weight_versions`` holds the distinct versions the sample ran under, in the order they
    were first used (the version its generate call started under first, then each version a
    weight update paused it into, with partial rollout). ``token_versions`` holds one version
    per response token (empty from engines that do not report it); ``rollout_log_probs`` holds
    one log-prob per response token, under the weights of that token's version. The oldest of
    all of them is the version that makes the sample stale.
    """

    index: int
    group_index: int
    prompt_tokens: list[int]
    response_tokens: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    reward: float = 0.0
    status: SampleStatus = SampleStatus.COMPLETED
    weight_versions: list[int] = field(default_factory=list)
    recycle_count: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)
    reward_error: str | None = None  # the reward function raised: the group is dropped

    def __post_init__(self) -> None:
        self.status = SampleStatus(self.status)
        self.weight_versions = [check_weight_version(v) for v in self.weight_versions]
        self.token_versions = [check_weight_version(v) for v in self.token_versions]
        if self.token_versions and len(self.token_versions) != len(self.response_tokens):
            raise VersionLabelError(
                f"sample {self.index}: {len(self.token_versions)} token versions for "
                f"{len(self.response_tokens)} response tokens"
            )

    def stamp(self, weight_version: object) -> None:
        """Record that a generate call ran under ``weight_version``."""
        self.weight_versions.append(check_weight_version(weight_version))

    @property
    def oldest_weight_version(self) -> int | None:
        """The oldest version that contributed tokens, or None if never stamped.

        ``min(weight_versions + token_versions)``: with per-token versions this is
        ``min(token_versions)``, the version staleness is measured from.
        """
        versions = self.weight_versions + self.token_versions
        return min(versions) if versions else None

    @property
    def version_span(self) -> int:
        """Weight updates this sample's generation crossed: newest - oldest version (0 if
        it ran under one version, or was never stamped)."""
        versions = self.weight_versions + self.token_versions
        return max(versions) - min(versions) if versions else 0


@dataclass
class Group:
    """The ``n_samples_per_prompt`` samples of one prompt; the unit of GRPO and of staleness."""

    group_index: int
    samples: list[Sample]

    @property
    def oldest_weight_version(self) -> int | None:
        """Min over the samples' versions; None if any sample was never stamped."""
        versions = [s.oldest_weight_version for s in self.samples]
        if not versions or any(v is None for v in versions):
            return None
        return min(v for v in versions if v is not None)

    @property
    def aborted(self) -> bool:
        """True if any sample came back ABORTED (the group must be regenerated)."""
        return any(s.status is SampleStatus.ABORTED for s in self.samples)


@dataclass(frozen=True)
class RolloutFnTrainInput:
    """Ask the rollout function for one training batch."""

    rollout_id: int
    weight_version: int

    def __post_init__(self) -> None:
        check_weight_version(self.weight_version)


class GroupRequest(NamedTuple):
    """One prompt group of a batched engine call (``generate_batch``): ``generate``'s
    arguments."""

    prompt: Prompt
    n_samples: int
    group_index: int


@dataclass(frozen=True)
class PromptPosition:
    """The prompt stream as a drain left it: every prompt dropped so far (index -> reason)
    and the index of the next fresh prompt. What a step's ``batch_trained`` records; it
    rides with the batch, so recording a step asks the rollout manager nothing."""

    dropped: dict[int, str]
    next_index: int


@dataclass
class RolloutFnTrainOutput:
    """One training batch: groups' samples in group-index order, plus rollout metrics and,
    from a rollout manager, the prompt position at the end of its drain."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)
    prompt_position: PromptPosition | None = None


@runtime_checkable
class EnginePool(Protocol):
    """The rollout engines, as the producer sees them (the control plane builds the pool)."""

    async def generate(self, prompt: Prompt, n_samples: int, group_index: int) -> list[Sample]:
        """Generate ``n_samples`` responses to ``prompt``.

        Every returned sample has ``group_index`` and is stamped by the engine with the
        version it ran under (``weight_versions=[label]``). A request aborted by a weight
        update comes back with status ``ABORTED`` rather than raising. Raising means the pool
        is broken: the producer dies.
        """
        ...


@runtime_checkable
class ReplaceableEnginePool(EnginePool, Protocol):
    """An engine pool that can take a restarted engine under an existing id."""

    def replace(self, engine_id: str, handle: Any) -> None:
        """Serve from ``handle`` under ``engine_id`` from now on, and consider it alive."""
        ...


@runtime_checkable
class RolloutConfig(Protocol):
    """The run options the rollout path reads (``orchestrator.config.RunConfig`` has them).

    Field meanings are documented on ``RunConfig``; the rollout path never imports it.
    """

    @property
    def rollout_batch_size(self) -> int: ...
    @property
    def n_samples_per_prompt(self) -> int: ...
    @property
    def max_weight_staleness(self) -> int | None: ...
    @property
    def async_unused_samples_handler(self) -> Literal["drop", "retry"]: ...
    @property
    def buffer_capacity(self) -> int: ...
    @property
    def async_max_concurrent_samples(self) -> int: ...
    @property
    def max_recycles(self) -> int: ...
    @property
    def sync(self) -> bool: ...
    @property
    def update_weights_interval(self) -> int: ...
    @property
    def max_partial_span(self) -> int | None: ...
    @property
    def reward_error_limit(self) -> float: ...
