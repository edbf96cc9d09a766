"""The staleness filter: decide, for one finished group, train on it, recycle it, or drop it.

A pure decision over a group and the current weight version; the data buffer carries it out.
In order, a group is::

    aborted (a sample came back ABORTED)      -> recycle (retry) or drop "aborted" (drop)
    the reward function raised on it          -> drop "reward_error" (never scored as 0)
    unversioned (a sample was never stamped)  -> recycle, whatever the handler: a bug upstream
    negative staleness (oldest > current)     -> recycle (retry) or drop "negative_staleness"
    stale (current - oldest > max staleness)  -> recycle (retry) or drop "stale" (drop)
    a sample spans more than max_partial_span -> recycle (retry) or drop "partial_span" (drop)
      versions (partial rollout; off by default)
    rejected by the dynamic filter            -> drop under its reason (regenerating it would
                                                 not add a GRPO signal)
    otherwise                                 -> train, with staleness = current - oldest

``oldest`` is the minimum over every sample's ``weight_versions`` and ``token_versions``: with
partial rollout a sample's tokens may come from several versions, and the oldest one decides.
A sample's span is its newest minus its oldest version (the weight updates it crossed).

The unversioned and negative cases are invariant violations (DESIGN section 6): logged as
errors here and counted by the step metrics.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from orchestrator.rollout.types import Group

__all__ = [
    "Action",
    "DynamicFilter",
    "Rejection",
    "StalenessFilter",
    "Verdict",
    "VersionProvider",
    "reject_uniform_rewards",
]

logger = logging.getLogger(__name__)

DynamicFilter = Callable[[Group], "str | None"]
"""``filter(group) -> None`` keeps the group; a string drops it, counted under that reason."""

VersionProvider = Callable[[int], int]
"""``current(at_least) -> version``: the weight version to measure staleness against.

Called once per screened group with that group's oldest version, so the provider can re-read
the ledger when the group is newer than what it knows. A result below ``at_least`` means a
negative staleness (a bug somewhere upstream): counted, and the group is not trained on.
"""


def reject_uniform_rewards(group: Group) -> str | None:
    """Dynamic filter: drop a group whose rewards are all equal (zero GRPO advantage)."""
    rewards = {sample.reward for sample in group.samples}
    return "no_signal" if len(rewards) <= 1 else None


class Rejection(str, enum.Enum):
    """Why a group is not trained on; also the drop reason of the first four."""

    ABORTED = "aborted"
    MISSING_VERSION = "missing_version"
    NEGATIVE_STALENESS = "negative_staleness"
    STALE = "stale"
    PARTIAL_SPAN = "partial_span"
    REWARD_ERROR = "reward_error"
    FILTERED = "filtered"  # by the dynamic filter; the drop reason is the filter's own


class Action(enum.Enum):
    """What the buffer does with a screened group."""

    TRAIN = "train"
    RECYCLE = "recycle"
    DROP = "drop"


@dataclass(frozen=True)
class Verdict:
    """The screen's decision on one group.

    ``staleness`` is set when the action is TRAIN; ``rejection`` and ``reason`` (the drop
    reason, or the reason it would have been dropped under) are set otherwise.
    """

    action: Action
    staleness: int | None = None
    rejection: Rejection | None = None
    reason: str | None = None


class StalenessFilter:
    """The screen of one data buffer.

    Args:
        max_weight_staleness: largest accepted ``current - oldest`` version lag; None = off.
        unused_samples_handler: ``retry`` recycles aborted, negative and stale groups; ``drop``
            drops them.
        dynamic_filter: optional :data:`DynamicFilter` for groups that pass staleness.
        max_partial_span: largest accepted version span of one sample; None = off.

    Raises:
        ValueError: a negative ``max_weight_staleness`` or ``max_partial_span``, or an
            unknown handler.
    """

    def __init__(
        self,
        max_weight_staleness: int | None = None,
        unused_samples_handler: Literal["drop", "retry"] = "retry",
        dynamic_filter: DynamicFilter | None = None,
        max_partial_span: int | None = None,
    ) -> None:
        if max_partial_span is not None and max_partial_span < 0:
            raise ValueError(f"max_partial_span must be >= 0, got {max_partial_span}")
        if max_weight_staleness is not None and max_weight_staleness < 0:
            raise ValueError(f"max_weight_staleness must be >= 0, got {max_weight_staleness}")
        if unused_samples_handler not in ("drop", "retry"):
            raise ValueError(
                f"unused_samples_handler must be drop|retry, got {unused_samples_handler!r}"
            )
        self.max_weight_staleness = max_weight_staleness
        self.unused_samples_handler = unused_samples_handler
        self.dynamic_filter = dynamic_filter
        self.max_partial_span = max_partial_span

    def screen(self, group: Group, current_version: VersionProvider) -> Verdict:
        """Decide what to do with ``group`` (see the module docstring).

        Raises:
            Whatever ``current_version`` or the dynamic filter raises.
        """
        if group.aborted:
            return self._unused(Rejection.ABORTED)
        if any(sample.reward_error for sample in group.samples):
            # Regenerating would call the same failing function: drop, whatever the handler.
            return Verdict(Action.DROP, rejection=Rejection.REWARD_ERROR,
                           reason=Rejection.REWARD_ERROR.value)
        oldest = group.oldest_weight_version
        if oldest is None:
            logger.error(
                "group %d has a sample without a weight version (invariant violation); "
                "recycling it", group.group_index,
            )
            return Verdict(Action.RECYCLE, rejection=Rejection.MISSING_VERSION,
                           reason=Rejection.MISSING_VERSION.value)
        staleness = current_version(oldest) - oldest
        if staleness < 0:
            logger.error(
                "group %d: negative staleness %d (oldest version %d is above the current "
                "version); not training on it", group.group_index, staleness, oldest,
            )
            return self._unused(Rejection.NEGATIVE_STALENESS)
        if self.max_weight_staleness is not None and staleness > self.max_weight_staleness:
            return self._unused(Rejection.STALE)
        if self.max_partial_span is not None and any(
            sample.version_span > self.max_partial_span for sample in group.samples
        ):
            return self._unused(Rejection.PARTIAL_SPAN)
        if self.dynamic_filter is not None:
            reason = self.dynamic_filter(group)
            if reason is not None:
                return Verdict(Action.DROP, rejection=Rejection.FILTERED, reason=str(reason))
        return Verdict(Action.TRAIN, staleness=staleness)

    def _unused(self, rejection: Rejection) -> Verdict:
        action = Action.RECYCLE if self.unused_samples_handler == "retry" else Action.DROP
        return Verdict(action, rejection=rejection, reason=rejection.value)
