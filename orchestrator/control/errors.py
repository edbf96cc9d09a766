"""Errors of the control plane.

::

    RuntimeError
     +-- StepFailedError            a step (train, quorum, weight update, checkpoint) failed on
     |    |                         every attempt the failure policy allows
     |    +-- NoCellAliveError      every train cell is lost
     +-- SupervisionLimitError      a replacement limit of the failure policy was reached
     +-- EngineLostError            an engine died during a weight update (nothing committed)
     +-- StartupError               the job cannot start here (one line for the user)
"""

from __future__ import annotations

__all__ = [
    "EngineLostError",
    "NoCellAliveError",
    "StartupError",
    "StepFailedError",
    "SupervisionLimitError",
]


class StepFailedError(RuntimeError):
    """A step (training or weight update) failed on every attempt; the message says why."""


class NoCellAliveError(StepFailedError):
    """Every cell is lost: nothing can train or publish."""


class SupervisionLimitError(RuntimeError):
    """The failure policy's limit of replacements was reached: the run ends (one line)."""


class EngineLostError(RuntimeError):
    """A weight update failed because a rollout engine died during it. The publisher is fine
    and nothing was committed; restart the engine and publish again."""


class StartupError(RuntimeError):
    """The job cannot start here (too few CPUs, no Ray cluster): one line for the user."""
