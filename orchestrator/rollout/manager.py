"""RolloutManager: the rollout path's owner, whose weight version comes from the ledger.

A plain class; the driver makes it a Ray actor where it allocates it
(``ray.remote(num_cpus=0.25)(RolloutManager)``), so tests build it without Ray. It opens the
ledger itself (read-only) from a URL, so it works inside an actor process.

The manager's ``weight_version`` is ``max(last accepted push, ledger head)``:

* the ledger head is read at the start of every drain, and again whenever a group's oldest
  version is newer than the current value (so staleness is never negative);
* ``set_weight_version(v)`` refuses ``v`` below the current value
  (:class:`VersionRegressionError`) in every mode, indep-dp included (miles only warned there,
  and a new cell with a fresh counter took a run from 57 back to 1), and refuses ``v`` above
  the ledger head (:class:`VersionAheadOfLedgerError`): a version nobody committed.

So the version never decreases and is never above the ledger head (DESIGN invariant 6).

Its refusals are :class:`~orchestrator.rollout.errors.RolloutVersionError` subclasses, which
pickle across Ray. A new manager (a resume, a replacement) rebuilds its prompt state from the
ledger itself (:meth:`RolloutManager.restore_from_ledger`): there is no state file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ledger import Ledger
from orchestrator.metric_keys import NEGATIVE_STALENESS_KEY, manager_metric_key, metric_key

from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptFactory, PromptSource
from orchestrator.rollout.errors import VersionAheadOfLedgerError, VersionRegressionError
from orchestrator.rollout.manager_state import restore_from_account
from orchestrator.rollout.manager_usage import ManagerUsage
from orchestrator.rollout.producer import DEFAULT_STALL_WARNING_S, FullyAsyncRolloutFn
from orchestrator.rollout.prompt_tracker import Accounting
from orchestrator.rollout.staleness import DynamicFilter
from orchestrator.rollout.types import (
    EnginePool,
    PromptPosition,
    ReplaceableEnginePool,
    RolloutConfig,
    RolloutFnTrainInput,
    RolloutFnTrainOutput,
    check_weight_version,
)

__all__ = ["RolloutManager"]

logger = logging.getLogger(__name__)


class RolloutManager:
    """Owns the prompt source, data buffer and producer of one run; serves training batches.

    Args:
        ledger_url: the run's ledger (opened read-only here; the schema must exist).
        run_id: a started run.
        config: the run's options (``RunConfig`` satisfies :class:`RolloutConfig`).
        make_prompt: deterministic ``index -> Prompt`` factory (the task's).
        engine_pool: the engines to generate with.
        dynamic_filter: optional group filter (see :mod:`orchestrator.rollout.staleness`).
        stall_warning_s: drains waiting this long without a group log a warning.

    Not thread-safe: call it from one event loop (a Ray async actor serialises nothing, but
    runs every method on its single loop, which is what this class expects).

    Raises:
        LedgerError: the ledger cannot be opened; UnknownRunError if the run was never started.
    """

    def __init__(
        self,
        ledger_url: str,
        run_id: str,
        config: RolloutConfig,
        make_prompt: PromptFactory,
        engine_pool: EnginePool,
        *,
        dynamic_filter: DynamicFilter | None = None,
        stall_warning_s: float = DEFAULT_STALL_WARNING_S,
    ) -> None:
        self.run_id = run_id
        self._sync = config.sync
        self._ledger = Ledger.open(ledger_url, readonly=True)
        try:
            self._weight_version = self._ledger.head(run_id).version
        except BaseException:
            self._ledger.close()
            raise
        self._source = PromptSource(make_prompt)
        self._engine_pool = engine_pool
        self._buffer = DataBuffer.from_config(config, dynamic_filter)
        # Admission control is always on: the producer paces itself on this manager's
        # ledger-backed version (no ledger read per group) and is woken when it grows.
        self._rollout = FullyAsyncRolloutFn.from_config(
            config, engine_pool, self._source, self._buffer, stall_warning_s=stall_warning_s,
            current_version=self.get_weight_version,
        )
        self._ledger_reads = 1
        self._usage = ManagerUsage(engine_pool)
        self._pushes_accepted = 0
        self._regressions_refused = 0
        self._ahead_refused = 0

    # ----------------------------------------------------------------- versions

    def get_weight_version(self) -> int:
        """The current weight version (no ledger read)."""
        return self._weight_version

    def set_weight_version(self, version: int) -> int:
        """Accept a version pushed by the publisher after it committed; return the current one.

        Precondition: ``version`` was committed to the ledger (``<= head``). Pushing the
        current version again is a no-op, so a retried push is safe.

        Raises:
            VersionLabelError: ``version`` is not a non-negative int.
            VersionRegressionError: ``version`` is below the current version. Counted, logged.
            VersionAheadOfLedgerError: ``version`` is above the ledger head. Counted, logged.
            LedgerError: the ledger could not be read.
            In every refusal the manager's version is unchanged.
        """
        version = check_weight_version(version)
        if version < self._weight_version:
            self._regressions_refused += 1
            error = VersionRegressionError(version, self._weight_version)
            logger.warning("run %s: %s", self.run_id, error)
            raise error
        if version > self._weight_version:
            head = self._read_ledger_head()
            if version > head:
                self._ahead_refused += 1
                error = VersionAheadOfLedgerError(version, head)
                logger.warning("run %s: %s", self.run_id, error)
                raise error
            self._weight_version = version
            self._rollout.notify()
        self._pushes_accepted += 1
        return self._weight_version

    def _read_ledger_head(self) -> int:
        self._ledger_reads += 1
        return self._ledger.head(self.run_id).version

    def _refresh_from_ledger(self) -> int:
        head = self._read_ledger_head()
        if head > self._weight_version:
            self._weight_version = head
            self._rollout.notify()
        elif head < self._weight_version:
            # Only possible if the ledger went backwards (a restored database): keep ours.
            logger.error(
                "run %s: ledger head %d is below the manager's version %d",
                self.run_id, head, self._weight_version,
            )
        return self._weight_version

    def _current_version(self, at_least: int) -> int:
        """The buffer's VersionProvider: re-read the ledger if a group is newer than us."""
        if at_least > self._weight_version:
            self._refresh_from_ledger()
        return self._weight_version

    # ----------------------------------------------------------------- rollout

    async def start(self) -> None:
        """Start the producer now, so engines work before the first drain (else it lazily does).

        Raises:
            RuntimeError: the manager was shut down.
        """
        self._rollout.start()

    async def generate(self, rollout_id: int) -> RolloutFnTrainOutput:
        """Drain one training batch of ``rollout_batch_size`` groups, sorted by group index.

        Reads the ledger head first. With ``config.sync`` the producer is paused again after
        the drain, so nothing is generated while the trainer works. Metrics include
        ``rollout/fully_async/weight_version`` (the version staleness was measured against at
        the end of the drain); ``prompt_position`` is :meth:`provenance_snapshot` as the drain
        ended, for the step's ``batch_trained``; and the manager's own cost since the last
        drain (:class:`~orchestrator.rollout.manager_usage.ManagerUsage`).

        Raises:
            ProducerDiedError: the producer died (an engine pool failure) or was shut down.
            LedgerError: the ledger could not be read; claimed groups go back to the buffer.
        """
        version = self._refresh_from_ledger()
        output = await self._rollout.drain(
            RolloutFnTrainInput(rollout_id=rollout_id, weight_version=version),
            self._current_version,
        )
        output.metrics[metric_key("weight_version")] = self._weight_version
        output.metrics.update(self._usage.since_last())
        dropped, next_index = self.provenance_snapshot()
        output.prompt_position = PromptPosition(dropped, next_index)
        if self._sync:
            # The synchronous baseline generates only while a drain waits for it.
            await self._rollout.pause()
        return output

    def replace_engine(self, engine_id: str, handle: Any) -> None:
        """Serve from ``handle`` under ``engine_id`` from now on (a restarted engine).

        Precondition: the engine already holds the run's current weights and version (the
        driver has the publisher update it first), so it never serves version-0 samples into
        a run that is past version 0. Requests still in flight on the dead engine have come
        back ABORTED and were recycled.

        Raises:
            TypeError: this manager's engine pool cannot take replacements.
        """
        if not isinstance(self._engine_pool, ReplaceableEnginePool):
            raise TypeError(f"{type(self._engine_pool).__name__} cannot replace engines")
        self._engine_pool.replace(engine_id, handle)
        logger.info("run %s: engine %s replaced", self.run_id, engine_id)

    def accounting(self) -> Accounting:
        """Where every prompt that entered is (invariant 7)."""
        return self._buffer.accounting()

    def prompt_states(self) -> dict[int, str]:
        """Every prompt index this manager saw -> its state (for audits and drills).

        States: ``trained``, ``dropped:<reason>``, ``pending``, ``in_flight``, ``buffered``,
        ``claimed``.
        """
        return self._buffer.prompt_states()

    def recycle_counts(self) -> dict[int, int]:
        """Recycle count of every unfinished prompt."""
        return self._buffer.recycle_counts()

    def admission_state(self) -> dict[str, int | bool | None]:
        """The admission bound now (see :meth:`FullyAsyncRolloutFn.admission_state`)."""
        return self._rollout.admission_state()

    def next_prompt_index(self) -> int:
        """Index of the next fresh prompt the source will hand out."""
        return self._source.next_index

    def provenance_snapshot(self) -> tuple[dict[int, str], int]:
        """What a ``batch_trained`` event needs from the manager, in one call: every prompt it
        dropped (index -> reason) and :meth:`next_prompt_index`."""
        return self._buffer.dropped_prompts(), self._source.next_index

    def metrics(self) -> dict[str, Any]:
        """Cumulative manager metrics: version, refusals, totals, prompt accounting."""
        accounting = self._buffer.accounting()
        return {
            metric_key("weight_version"): self._weight_version,
            NEGATIVE_STALENESS_KEY: self._buffer.negative_staleness_total,
            metric_key("missing_version_total"): self._buffer.missing_version_total,
            metric_key("queue_size"): self._buffer.queue_size,
            metric_key("recycled_total"): self._buffer.recycled_total,
            manager_metric_key("ledger_reads"): self._ledger_reads,
            manager_metric_key("pushes_accepted"): self._pushes_accepted,
            manager_metric_key("version_regressions_refused"): self._regressions_refused,
            manager_metric_key("version_ahead_refused"): self._ahead_refused,
            manager_metric_key("peak_in_flight"): self._rollout.peak_in_flight,
            manager_metric_key("admission_admitted_total"): self._admission_total("admitted"),
            manager_metric_key("admission_held_back_total"): self._admission_total("held_back"),
            manager_metric_key("prompts_entered"): accounting.entered,
            manager_metric_key("prompts_trained"): accounting.trained,
            manager_metric_key("prompts_dropped"): accounting.dropped_total,
            manager_metric_key("prompts_unaccounted"): accounting.unaccounted,
        }

    def _admission_total(self, name: str) -> int:
        admission = self._rollout.admission
        return getattr(admission, f"{name}_total") if admission is not None else 0

    # ----------------------------------------------------------------- restore

    def restore_from_ledger(self, held: Sequence[int] = ()) -> int:
        """Continue the prompt stream where the ledger's ``batch_trained`` events say, in a
        manager that has not generated yet: every prompt issued but neither trained nor dropped
        is regenerated first, except ``held`` (a drained batch the driver is about to train).
        Returns the number of prompts to regenerate. Safe to retry on a fresh manager.

        Raises:
            RuntimeError: this manager already started its producer or handed out prompts.
            ValueError: the ledger's account is inconsistent; nothing was restored.
            LedgerError: the ledger could not be read; nothing was restored.
        """
        if self._rollout.started or self._buffer.accounting().entered:
            raise RuntimeError("restore_from_ledger() needs a fresh manager (before generate)")
        self._ledger_reads += 1
        account = self._ledger.progress(self.run_id).prompts  # newest snapshot + events after
        pending = restore_from_account(account, self._source, self._buffer, held=held)
        logger.info("run %s: prompt position %d and %d pending prompts from the ledger",
                    self.run_id, self._source.next_index, pending)
        return pending

    async def shutdown(self) -> None:
        """Stop the producer (in-flight prompts return to pending) and close the ledger."""
        await self._rollout.stop()
        self._ledger.close()
