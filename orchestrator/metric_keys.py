"""The orchestrator's metric vocabulary: the keys of a ``metrics.jsonl`` line and of the
rollout manager's totals.

The few keys the ledger CLI reads back from a run directory (the step, the reward, the
staleness histogram it plots) live with the run layout in :mod:`ledger.run_layout` and are
re-exported here; everything else the orchestrator names is spelled only here.
"""

from __future__ import annotations

from ledger.run_layout import REWARD_KEY, STALENESS_HISTOGRAM_KEY, STEP_KEY

__all__ = [
    "FULLY_ASYNC_PREFIX",
    "MANAGER_PREFIX",
    "NEGATIVE_STALENESS_KEY",
    "PROMPTS_UNACCOUNTED_KEY",
    "REWARD_KEY",
    "STALENESS_HISTOGRAM_KEY",
    "STALENESS_MAX_KEY",
    "STEP_KEY",
    "TRAIN_STALENESS_MAX_KEY",
    "WEIGHT_VERSION_KEY",
    "manager_metric_key",
    "metric_key",
]

# Per-step rollout metrics (DESIGN section 6) all carry this prefix.
FULLY_ASYNC_PREFIX = "rollout/fully_async/"
WEIGHT_VERSION_KEY = "weight_version"
NEGATIVE_STALENESS_KEY = FULLY_ASYNC_PREFIX + "negative_staleness_total"
STALENESS_MAX_KEY = FULLY_ASYNC_PREFIX + "staleness_max"  # at drain time, as screened
TRAIN_STALENESS_MAX_KEY = FULLY_ASYNC_PREFIX + "train_staleness_max"  # as the loss sees it
# The rollout manager's own run totals (prompt accounting) carry this prefix.
MANAGER_PREFIX = "rollout_manager/"
PROMPTS_UNACCOUNTED_KEY = MANAGER_PREFIX + "prompts_unaccounted"

assert STALENESS_HISTOGRAM_KEY.startswith(FULLY_ASYNC_PREFIX)  # the ledger CLI spells it out


def metric_key(name: str) -> str:
    """The full key of a per-step rollout metric: ``metric_key("staleness_max")``."""
    return FULLY_ASYNC_PREFIX + name


def manager_metric_key(name: str) -> str:
    """The full key of a rollout-manager run total: ``manager_metric_key("prompts_trained")``."""
    return MANAGER_PREFIX + name
