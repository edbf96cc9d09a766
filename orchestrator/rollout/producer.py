"""FullyAsyncRolloutFn: a long-lived producer that keeps engines busy, and the drain.

The producer runs on the caller's event loop as one task. It keeps at most
``max_concurrent_groups`` prompt groups in flight against an
:class:`~orchestrator.rollout.types.EnginePool` (a group stays in flight until the buffer
accepted it, so a full buffer stops the producer taking prompts), takes recycled prompts before
fresh ones, and puts finished groups in the :class:`~orchestrator.rollout.data_buffer.DataBuffer`.
With an :class:`~orchestrator.rollout.admission.AdmissionControl`, it also starts a group only
while the staleness-aware bound allows it, and waits (for a new version, a freed slot or a
finished group) otherwise. ``drain`` collects one training batch.

A failed generation kills the producer (its prompt goes back to the pending queue first); a
drain then fails at once with :class:`~orchestrator.rollout.errors.ProducerDiedError`, even if
groups are queued, so a broken engine pool is never hidden behind a few steps of buffered data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from orchestrator.metric_keys import metric_key

from orchestrator.rollout.admission import AdmissionControl
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from orchestrator.rollout.errors import ProducerDiedError
from orchestrator.rollout.prompt_tracker import PromptState
from orchestrator.rollout.staleness import VersionProvider
from orchestrator.rollout.types import (
    EnginePool,
    Group,
    Prompt,
    RolloutConfig,
    RolloutFnTrainInput,
    RolloutFnTrainOutput,
    Sample,
)

__all__ = ["DEFAULT_STALL_WARNING_S", "FullyAsyncRolloutFn"]

logger = logging.getLogger(__name__)

DEFAULT_STALL_WARNING_S = 30.0
"""Seconds a drain waits without receiving a group before it logs a warning (and again)."""


class FullyAsyncRolloutFn:
    """Producer loop plus drain over one engine pool, prompt source and data buffer.

    Args:
        pool: the engines.
        source: fresh prompts.
        buffer: finished groups; also the accounting of every prompt.
        rollout_batch_size: groups per drained batch.
        n_samples_per_prompt: samples per group.
        max_concurrent_groups: groups in flight at most (``async_max_concurrent_samples``).
        stall_warning_s: a drain that receives no group for this long logs a warning (and
            again every such interval); it keeps waiting.
        admission: the staleness-aware bound; None = only ``max_concurrent_groups`` applies.
        current_version: ``() -> version`` the bound is evaluated at (the manager's
            ledger-backed version, no ledger read); required with ``admission``. Call
            :meth:`notify` when it may have grown.
    """

    def __init__(
        self,
        pool: EnginePool,
        source: PromptSource,
        buffer: DataBuffer,
        *,
        rollout_batch_size: int,
        n_samples_per_prompt: int,
        max_concurrent_groups: int,
        stall_warning_s: float = DEFAULT_STALL_WARNING_S,
        admission: AdmissionControl | None = None,
        current_version: Callable[[], int] | None = None,
    ) -> None:
        if admission is not None and current_version is None:
            raise ValueError("admission control needs current_version")
        for name, value in (
            ("rollout_batch_size", rollout_batch_size),
            ("n_samples_per_prompt", n_samples_per_prompt),
            ("max_concurrent_groups", max_concurrent_groups),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if stall_warning_s <= 0:
            raise ValueError(f"stall_warning_s must be > 0, got {stall_warning_s}")
        self.pool = pool
        self.source = source
        self.buffer = buffer
        self.rollout_batch_size = rollout_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_concurrent_groups = max_concurrent_groups
        self.stall_warning_s = stall_warning_s
        self.admission = admission
        self._current_version = current_version or (lambda: 0)
        self._wake = asyncio.Event()
        buffer.add_slot_listener(self.notify)
        self._producer: asyncio.Task[None] | None = None
        self._stopped = False
        self.peak_in_flight = 0

    @classmethod
    def from_config(
        cls,
        config: RolloutConfig,
        pool: EnginePool,
        source: PromptSource,
        buffer: DataBuffer,
        *,
        stall_warning_s: float = DEFAULT_STALL_WARNING_S,
        current_version: Callable[[], int] | None = None,
    ) -> FullyAsyncRolloutFn:
        """A rollout function shaped by ``config``, admission control on (it is off only
        when ``config.max_weight_staleness`` is None, or no ``current_version`` is given).

        With ``config.sync`` the bound is ``max_weight_staleness = 0``: exactly one batch per
        published version, so the synchronous baseline trains on-policy (no group left over
        from a drain to be trained one version late, none generated only to be thrown away).
        """
        admission = None
        if current_version is not None:
            staleness = 0 if config.sync else config.max_weight_staleness
            admission = AdmissionControl(
                staleness, config.rollout_batch_size, config.update_weights_interval,
            )
        return cls(
            pool,
            source,
            buffer,
            rollout_batch_size=config.rollout_batch_size,
            n_samples_per_prompt=config.n_samples_per_prompt,
            max_concurrent_groups=config.async_max_concurrent_samples,
            stall_warning_s=stall_warning_s,
            admission=admission,
            current_version=current_version,
        )

    # ----------------------------------------------------------------- lifecycle

    @property
    def started(self) -> bool:
        """True while a producer task exists (from :meth:`start` until :meth:`pause`)."""
        return self._producer is not None

    @property
    def producer_error(self) -> BaseException | None:
        """The exception that killed the producer, if it died of one."""
        task = self._producer
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    def start(self) -> None:
        """Start the producer on the running event loop; a no-op if it already started.

        Raises:
            RuntimeError: no running event loop, or :meth:`stop` was called.
        """
        if self._stopped:
            raise RuntimeError("rollout was stopped; build a new FullyAsyncRolloutFn")
        if self._producer is None:
            if self.admission is not None:
                self.admission.start(self._current_version(), self.buffer.accounting().trained)
            self._producer = asyncio.get_running_loop().create_task(
                self._produce(), name="rollout-producer"
            )
            self._producer.add_done_callback(_log_producer_exit)

    async def pause(self) -> None:
        """Cancel the producer so no generation runs until the next drain restarts it.

        In-flight prompts go back to pending (they are regenerated first); buffered groups
        stay buffered. This is the synchronous baseline's between-steps state.
        """
        task, self._producer = self._producer, None
        await _cancel(task)

    async def stop(self) -> None:
        """Cancel the producer and its generations; in-flight prompts go back to pending.

        Safe to call twice, or before :meth:`start`. A later drain raises ProducerDiedError.
        """
        self._stopped = True
        await _cancel(self._producer)

    # ----------------------------------------------------------------- producer

    def notify(self) -> None:
        """Wake the producer to re-check the admission bound (a new version, a freed slot).

        Safe from any code on the producer's event loop, and before :meth:`start`.
        """
        self._wake.set()

    def admission_state(self) -> dict[str, int | bool | None]:
        """The bound now: ``limit`` (None without a bound or before the first start),
        ``occupancy`` (trained since the origin + queued + in flight), ``holding`` (the
        bound is holding the next group back) and ``version`` (the one it is evaluated at)."""
        version = self._current_version()
        admission = self.admission
        if admission is None or admission.origin is None:
            return {"limit": None, "occupancy": None, "holding": False, "version": version}
        return {
            "limit": admission.limit(version),
            "occupancy": admission.occupancy(self.buffer.admission_load()),
            "holding": admission.holding,
            "version": version,
        }

    def _admits(self) -> bool:
        if self.admission is None:
            return True
        return self.admission.admits(self._current_version(), self.buffer.admission_load())

    async def _produce(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                # Cleared before the checks, so a wake-up that lands after them is not lost.
                self._wake.clear()
                while len(tasks) < self.max_concurrent_groups and self._admits():
                    prompt, recycle_count = self.buffer.take_prompt(self.source)
                    tasks.add(
                        asyncio.create_task(
                            self._generate_group(prompt, recycle_count),
                            name=f"rollout-group-{prompt.index}",
                        )
                    )
                self.peak_in_flight = max(self.peak_in_flight, len(tasks))
                waker = asyncio.create_task(self._wake.wait(), name="rollout-admission-wake")
                try:
                    done, _ = await asyncio.wait(
                        tasks | {waker}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waker.cancel()
                for task in done - {waker}:
                    tasks.discard(task)
                    task.result()  # a failed generation kills the producer
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _generate_group(self, prompt: Prompt, recycle_count: int) -> None:
        try:
            samples = await self.pool.generate(prompt, self.n_samples_per_prompt, prompt.index)
            group = self._make_group(prompt, samples, recycle_count)
            await self.buffer.put(group)
        except BaseException:
            if self.buffer.state_of(prompt.index) is PromptState.IN_FLIGHT:
                self.buffer.return_prompt(prompt.index)
            raise

    def _make_group(self, prompt: Prompt, samples: list[Sample], recycle_count: int) -> Group:
        if len(samples) != self.n_samples_per_prompt:
            raise ValueError(
                f"engine pool returned {len(samples)} samples for prompt {prompt.index}, "
                f"expected {self.n_samples_per_prompt}"
            )
        for sample in samples:
            if sample.group_index != prompt.index:
                raise ValueError(
                    f"engine pool returned a sample of group {sample.group_index} "
                    f"for prompt {prompt.index}"
                )
            sample.recycle_count = recycle_count
        return Group(group_index=prompt.index, samples=samples)

    # ----------------------------------------------------------------- drain

    async def drain(
        self, input: RolloutFnTrainInput, current_version_fn: VersionProvider
    ) -> RolloutFnTrainOutput:
        """Collect ``rollout_batch_size`` groups that pass the buffer's screen, sorted by index.

        Starts the producer if needed. ``current_version_fn`` is the buffer's
        :data:`~orchestrator.rollout.staleness.VersionProvider`. The output's metrics are the
        buffer's step metrics (see :meth:`DataBuffer.pop_step_metrics`) plus ``drain_time_s``.

        On failure or cancellation every group claimed so far goes back to the buffer.

        Raises:
            ProducerDiedError: the producer died or was stopped, checked before each group
                (so a dead producer wins over queued groups) and while waiting.
            Whatever ``current_version_fn`` raises.
        """
        started_at = time.monotonic()
        if self._stopped:
            raise ProducerDiedError("rollout producer was stopped")
        self.start()
        claimed: list[Group] = []
        try:
            while len(claimed) < self.rollout_batch_size:
                self._raise_if_producer_dead()
                claimed.append(await self._next_group(input, current_version_fn, len(claimed)))
            self.buffer.commit(claimed)
        except BaseException:
            self.buffer.release(claimed)
            raise
        claimed.sort(key=lambda group: group.group_index)
        metrics = self.buffer.pop_step_metrics()
        if self.admission is not None:
            metrics.update(self.admission.pop_metrics(self._current_version(),
                                                      self.buffer.admission_load()))
        metrics[metric_key("drain_time_s")] = time.monotonic() - started_at
        return RolloutFnTrainOutput(samples=[group.samples for group in claimed], metrics=metrics)

    async def _next_group(
        self, input: RolloutFnTrainInput, current_version_fn: VersionProvider, collected: int
    ) -> Group:
        producer = self._producer
        assert producer is not None
        get_task = asyncio.create_task(self.buffer.get(current_version_fn))
        returned = False
        try:
            waited = 0.0
            while True:
                done, _ = await asyncio.wait(
                    {get_task, producer},
                    timeout=self.stall_warning_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if get_task in done:
                    group = get_task.result()
                    returned = True
                    return group
                if producer in done:
                    self._raise_if_producer_dead()
                waited += self.stall_warning_s
                logger.warning(
                    "rollout %d: no group for %.0f s (%d/%d collected, %d in flight, "
                    "%d buffered, %d pending)%s",
                    input.rollout_id, waited, collected, self.rollout_batch_size,
                    self.buffer.in_flight_count, self.buffer.queue_size,
                    self.buffer.pending_count, self._hold_detail(),
                )
        finally:
            if not returned:
                await self._abandon(get_task)

    def _hold_detail(self) -> str:
        """``"; held back by the admission bound: ..."`` while the bound holds generation
        back (a drain then waits for a publish, not for an engine), else ``""``."""
        if self.admission is None:
            return ""
        detail = self.admission.hold_detail(self._current_version(),
                                            self.buffer.admission_load())
        return f"; {detail}" if detail else ""

    async def _abandon(self, get_task: asyncio.Task[Group]) -> None:
        """Cancel a pending get; a group it claimed meanwhile goes back to the buffer."""
        get_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await get_task
        if not get_task.cancelled() and get_task.exception() is None:
            self.buffer.release([get_task.result()])

    def _raise_if_producer_dead(self) -> None:
        task = self._producer
        if task is None or not task.done():
            return
        if self._stopped or task.cancelled():
            raise ProducerDiedError("rollout producer was stopped")
        error = task.exception()
        if error is None:
            raise ProducerDiedError("rollout producer exited")
        raise ProducerDiedError(
            f"rollout producer died: {type(error).__name__}: {error}"
        ) from error


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if running) and wait until it has unwound."""
    if task is None or task.done():
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _log_producer_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        logger.info("rollout producer stopped")
    elif task.exception() is not None:
        logger.error("rollout producer died", exc_info=task.exception())
