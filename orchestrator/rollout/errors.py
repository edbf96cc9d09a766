"""The rollout path's errors, in one tree.

Every error here pickles (they cross Ray actor boundaries: the control plane calls the
RolloutManager as an actor and gets these back). They hang from the orchestrator's root,
:class:`orchestrator.errors.OrchestratorError`, and keep their builtin bases::

    OrchestratorError
    ├── VersionLabelError (ValueError)     a weight-version label that is not an int >= 0
    ├── RolloutVersionError (ValueError)   a pushed version the manager refuses
    │   ├── VersionRegressionError             below the manager's current version
    │   └── VersionAheadOfLedgerError          above the ledger head (never committed)
    ├── ProducerDiedError (RuntimeError)   the rollout producer stopped; a drain cannot finish
    ├── RewardErrorsExceededError (RuntimeError)  too many reward errors in one step
    ├── TokenizerError (ValueError)        no loadable tokenizer, or no EOS token
    └── PromptDataError (ValueError)       a prompt file row that cannot be read

Ledger errors (``ledger.LedgerError`` and its subclasses) pass through unchanged.
"""

from __future__ import annotations

from orchestrator.errors import OrchestratorError

__all__ = [
    "ProducerDiedError",
    "PromptDataError",
    "RewardErrorsExceededError",
    "RolloutVersionError",
    "TokenizerError",
    "VersionAheadOfLedgerError",
    "VersionLabelError",
    "VersionRegressionError",
]


class VersionLabelError(OrchestratorError, ValueError):
    """A weight-version label that is not a non-negative integer."""


class RolloutVersionError(OrchestratorError, ValueError):
    """A pushed weight version the manager refused; its version is unchanged.

    Attributes:
        requested: the version that was pushed.
        reference: the version it was compared with (the manager's, or the ledger head).
    """

    def __init__(self, requested: int, reference: int, message: str | None = None) -> None:
        self.requested = requested
        self.reference = reference
        super().__init__(message or f"refused weight version {requested} (reference {reference})")

    def __reduce__(self):
        # Every class of the tree rebuilds its message from (requested, reference).
        return (type(self), (self.requested, self.reference))


class VersionRegressionError(RolloutVersionError):
    """The pushed version is below the manager's current version (``reference``)."""

    def __init__(self, requested: int, reference: int) -> None:
        super().__init__(
            requested,
            reference,
            f"refused weight version {requested}: below the current version {reference} "
            "(versions never decrease; a restarted or newly promoted cell must take its "
            "version from the ledger)",
        )


class VersionAheadOfLedgerError(RolloutVersionError):
    """The pushed version is above the ledger head (``reference``): it was never committed."""

    def __init__(self, requested: int, reference: int) -> None:
        super().__init__(
            requested,
            reference,
            f"refused weight version {requested}: above the ledger head {reference} "
            "(only committed versions may be pushed)",
        )


class ProducerDiedError(OrchestratorError, RuntimeError):
    """The rollout producer stopped (an exception, or ``FullyAsyncRolloutFn.stop``).

    The message names the cause; buffered groups stay buffered (none is lost).
    """


class RewardErrorsExceededError(OrchestratorError, RuntimeError):
    """More groups of one step were dropped as ``reward_error`` than ``reward_error_limit``
    allows: the reward function is broken. Raised by the drain; the run ends (``run_failed``).
    Every drop is already settled in the prompt account."""


class TokenizerError(OrchestratorError, ValueError):
    """The directory holds no loadable tokenizer, or it has no EOS token (one line)."""

class PromptDataError(OrchestratorError, ValueError):
    """Prompt data that cannot be used: a missing file, an unreadable row, a missing key.

    The message is one line naming the file (and the 1-based row), for a CLI to print and exit 2.
    """
