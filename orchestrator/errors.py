"""Errors of the orchestrator, under one root.

Every error the orchestrator raises on purpose is an :class:`OrchestratorError`; a few also keep
the builtin base they always had (``ValueError``, ``RuntimeError``) so existing ``except``
clauses keep working. Errors that cross Ray actor boundaries pickle. The tree::

    OrchestratorError
     +-- ConfigError (ValueError)         a config that cannot be loaded (one line, names the field)
     +-- UserError                        bad input at the terminal (one line, exit 2)
     +-- DrillError (ValueError)          a drill that cannot be run as asked (one line)
     +-- StopRun                          a drill's hook stops a job on purpose
                                          (:mod:`orchestrator.drills.context`; the runner resumes)
     +-- StartupError (RuntimeError)      the job cannot start here (one line for the user)
     +-- StepFailedError (RuntimeError)   a step (train, quorum, weight update, checkpoint) failed
     |    |                               on every attempt the failure policy allows
     |    +-- NoCellAliveError            every train cell is lost
     +-- SupervisionLimitError (RuntimeError)  a replacement limit of the failure policy was hit
     |    +-- RewardErrorLimitError       too many of a step's groups failed their reward
     +-- EngineLostError (RuntimeError)   an engine died during a weight update (nothing committed)
     +-- PublisherLostError               the publisher cell died or froze during a call
     +-- NoEngineAliveError (RuntimeError)  every engine of the pool is dead
     +-- RetryableFailure                 an attempt failed and was sorted out: run it again
     |                                    (internal to FailurePolicy.run, never escapes it)
     +-- rollout errors                   :mod:`orchestrator.rollout.errors` draws its own subtree
                                          (version refusals, a dead producer, reward errors)

Ledger errors (``ledger.LedgerError``) and Ray's pass through unchanged.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DrillError",
    "EngineLostError",
    "NoCellAliveError",
    "NoEngineAliveError",
    "OrchestratorError",
    "PublisherLostError",
    "RetryableFailure",
    "RewardErrorLimitError",
    "StartupError",
    "StepFailedError",
    "SupervisionLimitError",
    "UserError",
]


class OrchestratorError(Exception):
    """The root of every error the orchestrator raises on purpose."""


class ConfigError(OrchestratorError, ValueError):
    """A config that cannot be loaded: unreadable file, unknown key, or invalid value.

    The message is one line and names the field (``max_weight_staleness: ...``) or the file.
    """


class UserError(OrchestratorError):
    """Bad input from the person at the terminal: one line, exit 2."""


class DrillError(OrchestratorError, ValueError):
    """A drill that cannot be run as asked (unknown scenario, no local PostgreSQL): one line."""


class StartupError(OrchestratorError, RuntimeError):
    """The job cannot start here (too few CPUs, no Ray cluster): one line for the user."""


class StepFailedError(OrchestratorError, RuntimeError):
    """A step (training or weight update) failed on every attempt; the message says why."""


class NoCellAliveError(StepFailedError):
    """Every cell is lost: nothing can train or publish."""


class SupervisionLimitError(OrchestratorError, RuntimeError):
    """The failure policy's limit of replacements was reached: the run ends (one line)."""


class RewardErrorLimitError(SupervisionLimitError):
    """More than ``reward_error_limit`` of a step's groups were dropped as ``reward_error``:
    the reward function is broken, the run ends (``run_failed``, one line, exit 1)."""


class EngineLostError(OrchestratorError, RuntimeError):
    """A weight update failed because a rollout engine died during it. The publisher is fine
    and nothing was committed; restart the engine and publish again."""


class PublisherLostError(OrchestratorError):
    """The publisher cell is gone or frozen (its call raised a Ray actor error or timed out).

    Attributes:
        cell_id: the publisher that was lost.
        cause: the Ray error its call ended with.
    """

    def __init__(self, cell_id: str, cause: BaseException) -> None:
        super().__init__(f"publisher {cell_id} lost: {cause}")
        self.cell_id = cell_id
        self.cause = cause

    def __reduce__(self):
        return (type(self), (self.cell_id, self.cause))


class NoEngineAliveError(OrchestratorError, RuntimeError):
    """Every engine of the pool is dead; generation cannot continue."""


class RetryableFailure(OrchestratorError):
    """An attempt failed in a way the supervisor has sorted out: run the operation again.

    ``cause`` is the original error (the last one is named in the final error message).
    ``recovered`` says the sorting out removed what failed (a lost cell failed over, a dead or
    silent engine replaced): such an attempt does not use up the operation's attempts, since
    the restart budget and the number of cells bound how often that can happen
    (:meth:`~orchestrator.control.supervision.FailurePolicy.run`).
    """

    def __init__(self, cause: BaseException, *, recovered: bool = False) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.recovered = recovered

    def __reduce__(self):
        return (_retryable_failure, (self.cause, self.recovered))


def _retryable_failure(cause: BaseException, recovered: bool) -> RetryableFailure:
    """Unpickle a :class:`RetryableFailure` (its ``recovered`` is keyword-only)."""
    return RetryableFailure(cause, recovered=recovered)
