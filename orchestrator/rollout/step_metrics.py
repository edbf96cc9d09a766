"""The data buffer's per-step metrics: staleness statistics and what the screen filtered.

Partial rollout adds, over the groups trained in the step: ``mixed_version_ratio`` (samples
whose tokens span more than one version, over samples), ``version_span_max`` (the largest
newest - oldest version of a sample), ``tokens_kept_across_updates`` (tokens of trained samples
produced before a later version took over: what the abort mode would have thrown away), and,
over everything screened, ``tokens_trained`` and ``tokens_discarded`` (response tokens of
groups recycled or dropped: generated, never trained).

Counters since the last :meth:`StepMetrics.pop`, plus a few run totals (negative staleness,
missing versions, recycles) that a step never resets. Keys come from :mod:`ledger.run_layout`
(prefix ``rollout/fully_async/``, DESIGN section 6), the one home of metric names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.metric_keys import (
    NEGATIVE_STALENESS_KEY,
    STALENESS_HISTOGRAM_KEY,
    STALENESS_MAX_KEY,
    TRAIN_STALENESS_MAX_KEY,
    metric_key,
)
from orchestrator.rollout.staleness import Rejection, Verdict
from orchestrator.rollout.types import Group, Sample, SampleStatus

__all__ = ["StepMetrics", "train_staleness_metrics"]


@dataclass
class _StepCounts:
    staleness: list[int] = field(default_factory=list)
    stale_filtered: int = 0
    aborted_filtered: int = 0
    dynamic_filtered: int = 0
    partial_span_filtered: int = 0
    samples: int = 0
    mixed_samples: int = 0
    span_max: int = 0
    tokens_trained: int = 0
    tokens_kept: int = 0
    tokens_discarded: int = 0
    truncated: int = 0  # trained samples that reached max_response_len without EOS
    recycled: int = 0
    starved: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


class StepMetrics:
    """Counts what happens to groups during one training step, and a few run totals.

    The totals ``negative_staleness_total`` and ``missing_version_total`` are saved with the
    buffer's state (they must survive a restart: a negative staleness fails the run's audit);
    ``recycled_total`` counts since this object was created.
    """

    def __init__(self) -> None:
        self._step = _StepCounts()
        self.negative_staleness_total = 0
        self.missing_version_total = 0
        self.recycled_total = 0

    def screened(self, verdict: Verdict, group: Group | None = None) -> None:
        """Count a screen rejection (an accepted group is counted when trained); the
        rejected group's response tokens count as discarded."""
        if group is not None:
            self._step.tokens_discarded += sum(len(s.response_tokens) for s in group.samples)
        rejection = verdict.rejection
        if rejection is Rejection.ABORTED:
            self._step.aborted_filtered += 1
        elif rejection is Rejection.MISSING_VERSION:
            self.missing_version_total += 1
        elif rejection is Rejection.NEGATIVE_STALENESS:
            self.negative_staleness_total += 1
        elif rejection is Rejection.STALE:
            self._step.stale_filtered += 1
        elif rejection is Rejection.FILTERED:
            self._step.dynamic_filtered += 1
        elif rejection is Rejection.PARTIAL_SPAN:
            self._step.partial_span_filtered += 1

    def recycled(self) -> None:
        """Count a group whose prompt went back to the PENDING queue."""
        self._step.recycled += 1
        self.recycled_total += 1

    def starved(self) -> None:
        """Count a prompt dropped as starved (it also counts as dropped)."""
        self._step.starved += 1

    def dropped(self, reason: str) -> None:
        """Count a prompt dropped under ``reason``."""
        self._step.dropped[reason] += 1

    def trained(self, staleness: int, group: Group | None = None) -> None:
        """Count a group trained on at ``staleness`` (and its samples' versions and tokens)."""
        self._step.staleness.append(staleness)
        if group is None:
            return
        step = self._step
        for sample in group.samples:
            span = sample.version_span
            step.samples += 1
            step.mixed_samples += span > 0
            step.span_max = max(step.span_max, span)
            step.tokens_trained += len(sample.response_tokens)
            step.truncated += sample.status is SampleStatus.TRUNCATED
            step.tokens_kept += _tokens_before_newest(sample)

    def pop(self, *, queue_size: int, recycle_queue_size: int, in_flight: int) -> dict[str, Any]:
        """This step's metrics, keyed ``rollout/fully_async/<name>``; resets the step counts.

        Staleness statistics cover the groups trained since the last call; the sizes given
        are the buffer's at this moment.
        """
        step, self._step = self._step, _StepCounts()
        lags = step.staleness
        metrics: dict[str, Any] = {
            metric_key("staleness_avg"): sum(lags) / len(lags) if lags else 0.0,
            STALENESS_MAX_KEY: max(lags) if lags else 0,
            STALENESS_HISTOGRAM_KEY: dict(sorted(Counter(lags).items())),
            metric_key("trained"): len(lags),
            metric_key("stale_filtered"): step.stale_filtered,
            metric_key("aborted_filtered"): step.aborted_filtered,
            metric_key("dynamic_filtered"): step.dynamic_filtered,
            metric_key("partial_span_filtered"): step.partial_span_filtered,
            metric_key("mixed_version_ratio"): (
                step.mixed_samples / step.samples if step.samples else 0.0
            ),
            metric_key("version_span_max"): step.span_max,
            metric_key("tokens_trained"): step.tokens_trained,
            metric_key("truncated_samples"): step.truncated,
            metric_key("tokens_kept_across_updates"): step.tokens_kept,
            metric_key("tokens_discarded"): step.tokens_discarded,
            metric_key("recycled"): step.recycled,
            metric_key("starved"): step.starved,
            metric_key("dropped_total"): sum(step.dropped.values()),
            NEGATIVE_STALENESS_KEY: self.negative_staleness_total,
            metric_key("missing_version_total"): self.missing_version_total,
            metric_key("queue_size"): queue_size,
            metric_key("recycle_queue_size"): recycle_queue_size,
            metric_key("in_flight"): in_flight,
        }
        for reason, count in sorted(step.dropped.items()):
            metrics[metric_key(f"dropped/{reason}")] = count
        return metrics


def train_staleness_metrics(groups: list[list[Sample]], trainer_version: int) -> dict[str, Any]:
    """The staleness the loss sees: ``trainer_version`` (the weights the batch trains on) less
    each group's oldest version, as ``train_staleness_avg`` and ``train_staleness_max``.

    ``staleness_*`` above is measured when the batch is drained, against the ledger head then.
    Fully-async drains the next batch while the current one trains, before the current update
    commits, so a group trains up to one version later than it was screened: a drain-time 0
    is a train-time 1. A group with an unstamped sample (the screen never trains one: it
    counts it as ``missing_version``) is left out.
    """
    oldest = (Group(samples[0].group_index, samples).oldest_weight_version
              for samples in groups if samples)
    lags = [trainer_version - version for version in oldest if version is not None]
    return {
        metric_key("train_staleness_avg"): sum(lags) / len(lags) if lags else 0.0,
        TRAIN_STALENESS_MAX_KEY: max(lags) if lags else 0,
    }


def _tokens_before_newest(sample: Sample) -> int:
    """Tokens produced under an older version than the sample's newest one."""
    if not sample.token_versions:
        return 0
    newest = max(sample.token_versions)
    return sum(1 for version in sample.token_versions if version < newest)
