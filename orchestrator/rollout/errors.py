"""The rollout path's errors, in one tree.

Every error here pickles (they cross Ray actor boundaries: the control plane calls the
RolloutManager as an actor and gets these back)::

    ValueError
    ├── VersionLabelError              a weight-version label that is not an int >= 0
    └── RolloutVersionError            a pushed version the manager refuses
        ├── VersionRegressionError         below the manager's current version
        └── VersionAheadOfLedgerError      above the ledger head (never committed)
    RuntimeError
    └── ProducerDiedError              the rollout producer stopped; a drain cannot finish

Ledger errors (``ledger.LedgerError`` and its subclasses) pass through unchanged.
"""

from __future__ import annotations

__all__ = [
    "ProducerDiedError",
    "RewardErrorsExceededError",
    "RolloutVersionError",
    "VersionAheadOfLedgerError",
    "VersionLabelError",
    "VersionRegressionError",
]


class VersionLabelError(ValueError):
    """A weight-version label that is not a non-negative integer."""


class RolloutVersionError(ValueError):
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


class ProducerDiedError(RuntimeError):
    """The rollout producer stopped (an exception, or ``FullyAsyncRolloutFn.stop``).

    The message names the cause; buffered groups stay buffered (none is lost).
    """


class RewardErrorsExceededError(RuntimeError):
    """More groups of one step were dropped as ``reward_error`` than ``reward_error_limit``
    allows: the reward function is broken. Raised by the drain; the run ends (``run_failed``).
    Every drop is already settled in the prompt account."""
