"""What every rollout engine shares about sampling: the parameters, and turning decoded rows
into :class:`~orchestrator.rollout.types.Sample` objects (statuses, rewards through the task,
per-token versions). Engine-independent; no Ray, no torch (the tensor side of a decode step,
the nucleus filter included, is :mod:`actors.engines.decoding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from actors.engines.scoring import score_group
from orchestrator.rollout.types import Prompt, Sample, SampleStatus

__all__ = ["DecodedRow", "Decoding", "SamplingParams", "build_samples", "distinct"]


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled. ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 3

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(f"invalid sampling parameters: {self}")

    @classmethod
    def from_value(cls, value: SamplingParams | dict[str, Any] | None) -> SamplingParams:
        """``value`` as parameters (None: the defaults).

        Raises:
            ValueError: unknown keys or invalid values.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown sampling keys: {sorted(unknown)}")
        return cls(**value)


def distinct(versions: Sequence[int]) -> list[int]:
    """``versions`` without repeats, in the order first seen."""
    return list(dict.fromkeys(versions))


@dataclass(frozen=True)
class DecodedRow:
    """One response as an engine decoded it: tokens, their log-probs and versions, the
    distinct versions it ran under (the start version first) and its status."""

    tokens: list[int]
    log_probs: list[float]
    token_versions: list[int]
    weight_versions: list[int]
    status: SampleStatus


@dataclass
class Decoding:
    """What one generate call of the built-in engine has decoded so far, row by row."""

    start_version: int
    responses: list[list[int]]
    log_probs: list[list[float]]
    token_versions: list[list[int]]
    finished: list[bool]

    @classmethod
    def empty(cls, n_samples: int, start_version: int) -> Decoding:
        """``n_samples`` empty rows, started under ``start_version``."""
        return cls(start_version, [[] for _ in range(n_samples)],
                   [[] for _ in range(n_samples)], [[] for _ in range(n_samples)],
                   [False] * n_samples)

    def extend(self, tokens: Sequence[int], log_probs: Sequence[float], version: int,
               eos_id: int) -> bool:
        """Append one decode step's token (with its log-prob and ``version``) to every
        unfinished row; a row finishes at ``eos_id``. Returns whether every row is finished."""
        for row, token in enumerate(tokens):
            if not self.finished[row]:
                self.responses[row].append(token)
                self.log_probs[row].append(log_probs[row])
                self.token_versions[row].append(version)
                self.finished[row] = token == eos_id
        return all(self.finished)

    def rows(self, aborted: bool) -> list[DecodedRow]:
        """The rows as finished: COMPLETED (EOS), else ABORTED if ``aborted``, else
        TRUNCATED; each row's versions are the start version, then its tokens'."""
        unfinished = SampleStatus.ABORTED if aborted else SampleStatus.TRUNCATED
        return [DecodedRow(response, log_probs, versions,
                           distinct([self.start_version, *versions]),
                           SampleStatus.COMPLETED if done else unfinished)
                for response, log_probs, versions, done in zip(
                    self.responses, self.log_probs, self.token_versions, self.finished)]


def build_samples(task: Any, engine_id: str, prompt: Prompt, group_index: int,
                  rows: Sequence[DecodedRow]) -> list[Sample]:
    """The group's samples: rewards from ``task`` (0 for ABORTED rows; a reward error is
    kept on the others), indices ``group_index * len(rows) + row``."""
    statuses = [row.status for row in rows]
    rewards, reward_error = score_group(task, prompt, [row.tokens for row in rows], statuses)
    return [
        Sample(
            index=group_index * len(rows) + index,
            group_index=group_index,
            prompt_tokens=list(prompt.tokens),
            response_tokens=list(row.tokens),
            rollout_log_probs=list(row.log_probs),
            reward=rewards[index],
            status=row.status,
            weight_versions=list(row.weight_versions),
            token_versions=list(row.token_versions),
            metadata={"engine_id": engine_id, "prompt_index": prompt.index,
                      "label": prompt.label},
            reward_error=None if row.status is SampleStatus.ABORTED else reward_error,
        )
        for index, row in enumerate(rows)
    ]
