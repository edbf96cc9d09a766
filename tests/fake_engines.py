"""A fake engine pool and prompt factory for rollout tests (they stand in for GPU engines).

A module of its own (not a conftest) so Ray workers can import it by name when a test passes
the pool to a RolloutManager actor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from orchestrator.rollout.types import Prompt, Sample, SampleStatus

__all__ = ["FakeEnginePool", "build_ledger", "make_prompt", "run_async", "settle"]


def make_prompt(index: int) -> Prompt:
    """Deterministic toy prompt ``index``."""
    return Prompt(index=index, tokens=(index % 7, index % 11, 3), label=str(index % 5))


class FakeEnginePool:
    """Engines that stamp each group with ``version`` as it was when generation started.

    Knobs, all keyed by prompt index:
        ``abort``: come back ABORTED once (the next attempt completes).
        ``fail``: raise RuntimeError (the pool is broken).
        ``stamp``: stamp with this version instead (None: leave the samples unstamped).
    With ``gated=True`` every request waits until the test releases it. ``on_generate``, if
    set, is called with the prompt index as each request arrives (tests check invariants that
    must hold whenever a group starts).
    """

    def __init__(self, version: int = 0, *, gated: bool = False) -> None:
        self.version = version
        self.gated = gated
        self.abort: set[int] = set()
        self.fail: set[int] = set()
        self.stamp: dict[int, int | None] = {}
        self.calls: list[int] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.on_generate: Callable[[int], None] | None = None
        self._gates: dict[int, asyncio.Future[SampleStatus]] = {}

    async def generate(self, prompt: Prompt, n_samples: int, group_index: int) -> list[Sample]:
        self.calls.append(prompt.index)
        self.in_flight += 1
        if self.on_generate is not None:
            self.on_generate(prompt.index)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        label = self.stamp.get(prompt.index, self.version)
        try:
            status = SampleStatus.COMPLETED
            if self.gated:
                gate = asyncio.get_running_loop().create_future()
                self._gates[prompt.index] = gate
                try:
                    status = await gate
                finally:
                    self._gates.pop(prompt.index, None)
            else:
                await asyncio.sleep(0)
            if prompt.index in self.fail:
                raise RuntimeError(f"engine crashed on prompt {prompt.index}")
            if prompt.index in self.abort:
                self.abort.discard(prompt.index)
                status = SampleStatus.ABORTED
        finally:
            self.in_flight -= 1
        return [
            Sample(
                index=group_index * n_samples + i,
                group_index=group_index,
                prompt_tokens=list(prompt.tokens),
                response_tokens=[prompt.index % 13, i],
                reward=float(i % 2),
                status=status,
                weight_versions=[] if label is None else [label],
            )
            for i in range(n_samples)
        ]

    def waiting(self) -> list[int]:
        """Prompt indices of gated requests waiting to be released, oldest first."""
        return list(self._gates)

    def release(self, index: int, status: SampleStatus = SampleStatus.COMPLETED) -> None:
        self._gates[index].set_result(status)

    def release_all(self, status: SampleStatus = SampleStatus.COMPLETED) -> None:
        for index in self.waiting():
            self.release(index, status)


async def settle(rounds: int = 20) -> None:
    """Let ready tasks run (the fake pool never sleeps on a timer)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def run_async(coroutine_fn: Callable[[], object], timeout: float = 20.0) -> object:
    """Run ``coroutine_fn()`` on a fresh loop with a timeout, so a hang fails the test."""

    async def bounded():
        return await asyncio.wait_for(coroutine_fn(), timeout)

    return asyncio.run(bounded())


def build_ledger(url: str, run_id: str, commits: int, cell_id: str = "cell-0") -> int:
    """Start ``run_id``, promote ``cell_id`` and make ``commits`` real commits; return epoch."""
    from ledger import Ledger

    ledger = Ledger.open(url)
    try:
        ledger.start_run(run_id, config={})
        epoch = ledger.promote(run_id, cell_id, reason="start")
        for step in range(commits):
            ledger.commit_weights(run_id, cell_id=cell_id, epoch=epoch, train_step=step)
        return epoch
    finally:
        ledger.close()
