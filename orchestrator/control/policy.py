"""The one failure policy: every retry and replacement limit of the control plane.

Like Ray Train's ``FailureConfig`` and an OTP supervisor's restart intensity, the limits are
declared once and nothing else retries or restarts:

- ``max_attempts``: attempts of one operation (a train step, forming a quorum, a weight
  update, a checkpoint). Each failed attempt is sorted out first (lost cells marked, a
  publisher promoted, dead engines restarted), then the operation runs again.
- ``max_restarts`` in ``restart_window_s``: replacements of actors (healed cells, restarted
  engines, replaced rollout managers). One more ends the run with
  :class:`~orchestrator.control.errors.SupervisionLimitError`, never a loop.
- ``heartbeat_timeout_s``: how long a cell or engine may stay silent before it is lost; every
  wait on an actor is bounded by it (plus ``step_grace_s`` for calls that compute).
- ``actor_start_timeout_s``: how long a replacement actor may take to start on the node it
  was placed on; one that dies or does not start in time is placed again on another node, at
  most ``max_attempts`` times (a node that is dying is probed for ``heartbeat_timeout_s``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from orchestrator.config import RunConfig
from orchestrator.control.errors import SupervisionLimitError

__all__ = ["FailurePolicy", "RestartBudget", "RetryableFailure"]

logger = logging.getLogger(__name__)


class RetryableFailure(Exception):
    """An attempt failed in a way the supervisor has sorted out: run the operation again.

    ``cause`` is the original error (the last one is re-raised in the final error message).
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class FailurePolicy:
    """Every limit of supervision, in one place. Build with :meth:`from_config`."""

    heartbeat_timeout_s: float = 10.0
    step_grace_s: float = 5.0
    max_attempts: int = 3
    max_restarts: int = 10
    restart_window_s: float = 600.0
    manager_call_timeout_s: float = 60.0
    actor_start_timeout_s: float = 180.0

    @classmethod
    def from_config(cls, config: RunConfig) -> FailurePolicy:
        """The policy of a run: its heartbeat timeout, the defaults for the rest."""
        return cls(heartbeat_timeout_s=config.heartbeat_timeout_s)

    @property
    def step_timeout_s(self) -> float:
        """The bound on a call that computes (a step, a quorum, an update): survivors report
        a failed collective within the heartbeat timeout, so a silent cell is lost after it."""
        return self.heartbeat_timeout_s + max(self.heartbeat_timeout_s, self.step_grace_s)

    def attempts(self) -> Retrying:
        """A tenacity loop of ``max_attempts`` attempts that retries :class:`RetryableFailure`
        only (anything else propagates at once); after the last attempt the final
        ``RetryableFailure`` is re-raised for the caller to turn into its own error."""
        return Retrying(
            stop=stop_after_attempt(self.max_attempts),
            retry=retry_if_exception_type(RetryableFailure),
            reraise=True,
        )


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
