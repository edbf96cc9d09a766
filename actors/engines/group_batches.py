"""Batched engine calls: many prompt groups in one Ray call, one answer back.

The rollout manager's engine pool sends the groups it starts together to an engine as one
``generate_batch`` call (:class:`~orchestrator.control.engine_pool.ray_pool.RayEnginePool`),
so a step costs a few Ray round trips instead of one per group. Inside the engine each group
still runs as its own ``generate`` call on a thread of its own, exactly as concurrent Ray calls
would: pauses, partial rollout, per-token versions and aborts behave the same. The call
returns when every group of it has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestrator.rollout.types import GroupRequest, Prompt, Sample

__all__ = ["GroupBatches"]

Generate = Callable[[Prompt, int, int], list[Sample]]


class GroupBatches:
    """Runs the groups of a batched call concurrently, each through ``generate``.

    Args:
        generate: the engine's ``generate(prompt, n_samples, group_index)``.
        max_concurrency: threads at most (the engine's own limit of concurrent calls).
    """

    def __init__(self, generate: Generate, max_concurrency: int) -> None:
        self._generate = generate
        # Made here, not on the first batch: concurrent batched calls would race to make it
        # (its threads still start only as groups are submitted).
        self._threads = ThreadPoolExecutor(max_concurrency, thread_name_prefix="engine-group")

    def run(self, requests: Sequence[GroupRequest]) -> list[list[Sample]]:
        """Every request's samples, in request order, once all of them finished.

        Raises:
            The first request's error, in request order, after every request finished (a
            group that raises kills the producer, as a single call would).
        """
        if len(requests) == 1:
            return [self._generate(*requests[0])]
        futures = [self._threads.submit(self._generate, *request) for request in requests]
        errors = [future.exception() for future in futures]  # waits for every group
        for error in errors:
            if error is not None:
                raise error
        return [future.result() for future in futures]
