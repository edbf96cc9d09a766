"""Errors raised by the actors: one root, :class:`ActorError`. All of them pickle, so they
cross Ray boundaries intact (``ray.get`` re-raises them as a ``RayTaskError`` that is also an
instance of the class).

    ActorError (RuntimeError)
    ├── StaleEpochError      weight traffic from an epoch lower than one the engine has seen
    ├── EngineStateError     an engine asked to do something its state forbids
    ├── TransferError        engines disagree on what they received (checksum mismatch)
    ├── EngineSilentError    an engine gave no answer to a weight-update call within its deadline
    ├── CollectiveError      cross-cell gradient averaging failed (peer died, timeout)
    ├── PolicyError          the policy cannot be built or loaded here
    ├── DeviceError          the device an actor was given cannot be used (no CUDA)
    ├── InjectedFault        a fault armed on a weight update's named point (drills, tests)
    ├── StorageError         also an OSError: a checkpoint location that cannot be used
    └── RewardLoadError      also a ValueError: a reward function that cannot be loaded

``StorageError`` and ``RewardLoadError`` keep their second base so callers that handle a
missing file (``OSError``) or bad configuration (``ValueError``) handle them too.
"""

from __future__ import annotations

__all__ = [
    "ActorError",
    "CollectiveError",
    "DeviceError",
    "EngineSilentError",
    "EngineStateError",
    "InjectedFault",
    "PolicyError",
    "RewardLoadError",
    "StaleEpochError",
    "StorageError",
    "TransferError",
]


class ActorError(RuntimeError):
    """Base class of the actors' errors."""


class StaleEpochError(ActorError):
    """An engine refused weights, a version stamp or a resume from a superseded epoch.

    Nothing in the engine changed. ``epoch`` is what the caller sent, ``highest_epoch`` the
    highest epoch the engine has seen, ``operation`` the refused method.
    """

    def __init__(self, engine_id: str, operation: str, epoch: int, highest_epoch: int) -> None:
        super().__init__(
            f"engine {engine_id} refused {operation} from epoch {epoch}: "
            f"it has seen epoch {highest_epoch}"
        )
        self.engine_id = engine_id
        self.operation = operation
        self.epoch = epoch
        self.highest_epoch = highest_epoch

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.engine_id, self.operation, self.epoch, self.highest_epoch))


class EngineStateError(ActorError):
    """An engine was asked for an operation its state forbids (e.g. weights while serving)."""


class TransferError(ActorError):
    """A weight transfer reached the engines inconsistently; nothing may be committed."""


class EngineSilentError(ActorError):
    """An engine gave no answer to a weight-update call (pause, load, stamp, resume) within
    the update's deadline: frozen (SIGSTOPped) or hung. Like a dead engine, it is an engine
    loss: the control plane probes the engines, replaces the silent one and tries again.

    ``engine_index`` is the engine's position in the update's engine list.
    """

    def __init__(self, engine_index: int, operation: str, timeout_s: float) -> None:
        super().__init__(f"engine {engine_index} gave no answer to {operation} within "
                         f"{timeout_s:g}s")
        self.engine_index = engine_index
        self.operation = operation
        self.timeout_s = timeout_s

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.engine_index, self.operation, self.timeout_s))


class CollectiveError(ActorError):
    """Cross-cell gradient averaging failed; the step was not applied."""


class PolicyError(ActorError):
    """The policy cannot be built here (unknown backend, foreign distributed world, ...) or
    given tensors do not fit it."""


class DeviceError(ActorError):
    """The device an actor was given cannot be used (CUDA asked for, none visible)."""


class InjectedFault(ActorError):
    """Raised at a weight update's armed point (:class:`actors.publishing.sequence.UpdatePoint`)
    by a fault with the ``raise`` action: the update stops there as if that step failed."""


class StorageError(ActorError, OSError):
    """A storage location that cannot be used (relative path, unknown protocol, unreadable).

    An ``OSError``, so callers that handle a missing file handle this too; the message is one
    line naming the URL.
    """


class RewardLoadError(ActorError, ValueError):
    """The reward function cannot be imported or is not callable (one line)."""
