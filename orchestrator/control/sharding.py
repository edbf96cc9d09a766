"""Splitting a batch of groups across cells, and merging what the cells report back."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.rollout.types import Sample

__all__ = ["merge_cell_metrics", "shard_groups"]


def shard_groups(groups: Sequence[Sequence[Sample]], parts: int) -> list[list[Sequence[Sample]]]:
    """Split groups into ``parts`` contiguous shards of near-equal size (none empty).

    Raises:
        ValueError: fewer groups than parts.
    """
    if len(groups) < parts:
        raise ValueError(f"{len(groups)} groups cannot feed {parts} cells")
    size, extra = divmod(len(groups), parts)
    shards, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        shards.append(list(groups[start:end]))
        start = end
    return shards


def merge_cell_metrics(results: list[dict[str, float]], shards: list[list]) -> dict[str, float]:
    """Average per-cell metrics weighted by their shard's group count."""
    total = sum(len(s) for s in shards)
    merged: dict[str, float] = {}
    for metrics, shard in zip(results, shards, strict=True):
        weight = len(shard) / total
        for key, value in metrics.items():
            merged[key] = merged.get(key, 0.0) + weight * float(value)
    merged["cells_in_step"] = float(len(results))
    return merged
