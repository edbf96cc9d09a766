"""The one failure policy: every retry, replacement and wait limit of the control plane.

Like Ray Train's ``FailureConfig`` and an OTP supervisor's restart intensity, the limits are
declared once and nothing else retries or restarts:

- ``max_attempts``: attempts of one operation (a train step, forming a quorum, a weight
  update, a checkpoint), run by :meth:`FailurePolicy.run`. Each failed attempt is sorted out
  first (lost cells marked, a publisher promoted, dead engines restarted) and says so by
  raising :class:`RetryableFailure`; then the operation runs again. An attempt whose failure
  was recovered (the failed cell failed over, the failed engine replaced) does not count:
  overlapping faults can each cost one attempt of the same update, and each was dealt with
  (the restart budget bounds those).
- ``max_restarts`` in ``restart_window_s``: replacements of actors (healed cells, restarted
  engines, replaced rollout managers). One more ends the run with
  :class:`~orchestrator.errors.SupervisionLimitError`, never a loop.
- ``heartbeat_timeout_s``: how long a cell or engine may stay silent before it is lost; every
  wait on an actor is bounded by it (:attr:`step_timeout_s` for calls that compute,
  :attr:`engine_call_timeout_s` for a publisher cell's waits on its engines,
  :attr:`probe_timeout_s` for an engine's health probe, :attr:`transfer_timeout_s` for
  copying a cell's state).
- ``first_start_timeout_s``: how long the run's first cells and engines may take to answer
  (a first start may load a model and compile kernels).
- ``actor_start_timeout_s``: how long a replacement actor may take to start on the node it
  was placed on; one that dies or does not start in time is placed again on another node, at
  most ``max_attempts`` times (a node that is dying is probed for ``heartbeat_timeout_s``).
- ``manager_call_timeout_s``: the bound on every call on the rollout manager, and how long a
  drain may wait without a batch before the manager is probed; ``manager_probe_timeout_s``:
  the bound on that probe (a version read, which a live manager answers between the awaits of
  its drains), so a frozen manager is replaced after one call timeout and a probe, not two
  call timeouts.
- ``node_probe_timeout_s``: how long a live node may take to run the probe task that clears it
  for a replacement rollout manager. On a loaded node the probe may need a new worker process
  (seconds, more than a heartbeat), so it has a deadline of its own, and the round of probes is
  tried again, at most ``max_attempts`` times, before the replacement fails.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from orchestrator.config import RunConfig
from orchestrator.errors import RetryableFailure, StepFailedError, SupervisionLimitError

__all__ = ["FailurePolicy", "RestartBudget", "RetryableFailure"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")



@dataclass(frozen=True)
class FailurePolicy:
    """Every limit of supervision, in one place. Build with :meth:`from_config`."""

    heartbeat_timeout_s: float = 10.0
    step_grace_s: float = 5.0
    max_attempts: int = 3
    max_restarts: int = 10
    restart_window_s: float = 600.0
    manager_call_timeout_s: float = 60.0
    manager_probe_timeout_s: float = 10.0
    actor_start_timeout_s: float = 180.0
    probe_grace_s: float = 30.0
    first_start_timeout_s: float = 900.0
    node_probe_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: RunConfig) -> FailurePolicy:
        """The policy of a run: its heartbeat timeout and restart limit, the defaults for the
        rest."""
        return cls(heartbeat_timeout_s=config.heartbeat_timeout_s,
                   max_restarts=config.max_restarts)

    @property
    def step_timeout_s(self) -> float:
        """The bound on a call that computes (a step, a quorum, an update): survivors report
        a failed collective within the heartbeat timeout, so a silent cell is lost after it."""
        return self.heartbeat_timeout_s + max(self.heartbeat_timeout_s, self.step_grace_s)

    @property
    def engine_call_timeout_s(self) -> float:
        """The bound on a publisher cell's waits on its engines within one weight update
        (pause, load, stamp, resume, all together): a heartbeat shorter than
        :attr:`step_timeout_s`, so a silent engine is reported by the cell as an engine loss
        (probed and replaced) before the cell itself looks silent (failed over)."""
        return self.step_timeout_s - self.heartbeat_timeout_s

    @property
    def probe_timeout_s(self) -> float:
        """The bound on an engine's health probe, sent before a train step and read after it:
        an engine silent this long (frozen, SIGSTOPped) counts as dead and is replaced. The
        grace covers an engine busy finishing a decode step on a loaded machine."""
        return self.step_timeout_s + self.probe_grace_s

    @property
    def transfer_timeout_s(self) -> float:
        """The bound on moving a cell's state (heal, copy, checkpoint load): its weights and
        optimizer state travel through the object store, which may take a while."""
        return self.step_timeout_s + self.actor_start_timeout_s

    def run(self, operation: Callable[[], _T], what: str) -> _T:
        """Run ``operation`` until it succeeds; return its result.

        ``operation`` raises :class:`RetryableFailure` after it has sorted out a failed
        attempt; anything else propagates at once, unchanged. ``max_attempts`` failures that
        were not recovered end it (a recovered one removed what failed, and replacements are
        charged to the restart budget), and so do ``max_attempts + max_restarts`` failures of
        any kind, a bound that never loops.

        Raises:
            StepFailedError: the attempts are used up; the message is ``what`` (say "train
                step failed"), the attempts and the last cause, which is chained.
        """
        unrecovered = 0

        def used_up(state: RetryCallState) -> bool:
            nonlocal unrecovered
            failure = state.outcome.exception() if state.outcome is not None else None
            if not (isinstance(failure, RetryableFailure) and failure.recovered):
                unrecovered += 1
            return (unrecovered >= self.max_attempts
                    or state.attempt_number >= self.max_attempts + self.max_restarts)

        retrying = Retrying(stop=used_up, retry=retry_if_exception_type(RetryableFailure),
                            reraise=True)
        try:
            return retrying(operation)
        except RetryableFailure as exc:
            attempts = retrying.statistics.get("attempt_number", self.max_attempts)
            raise StepFailedError(f"{what} after {attempts} attempts; last error: "
                                  f"{exc.cause}") from exc.cause


@dataclass
class RestartBudget:
    """The restart intensity: at most ``max_restarts`` replacements in ``restart_window_s``."""

    policy: FailurePolicy
    _stamps: deque[float] = field(default_factory=deque)
    total: int = 0

    def charge(self, what: str) -> None:
        """Count one replacement of ``what``.

        Raises:
            SupervisionLimitError: more than ``max_restarts`` in the window; nothing replaced.
        """
        now = time.monotonic()
        while self._stamps and now - self._stamps[0] > self.policy.restart_window_s:
            self._stamps.popleft()
        if len(self._stamps) >= self.policy.max_restarts:
            raise SupervisionLimitError(
                f"{what}: more than {self.policy.max_restarts} replacements in "
                f"{self.policy.restart_window_s:g}s; giving up"
            )
        self._stamps.append(now)
        self.total += 1
