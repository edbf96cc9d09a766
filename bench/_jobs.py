"""Shared by the job benchmarks: engine set-ups, one measured run, what its metrics say.

Not a benchmark itself. ``bench/async_vs_sync.py`` and ``bench/time_to_reward.py`` import it
(they run as scripts, so this directory is on ``sys.path``).

Engine set-ups:

- ``cpu``: the built-in engines, sampling on the same CPU cores the trainer cells use.
- ``device``: the same engines, plus a wait per decode step that stands for that step
  running on an accelerator of its own (the deployment fully-async RL is built for, and the one
  a CPU-only machine cannot show). The wait holds no core, so generation overlaps training as
  it would on separate GPUs. As on a batching engine (vLLM, SGLang), every sequence of an engine
  advances in one device step: the steps end on the ticks of a ``device_s_per_token`` clock,
  and a token computed on the CPU is out at the next tick; so a weight update's pause waits for
  the step in progress (half a step on average), as on a real engine, not for the slowest of
  many independent per-call waits. The engine still computes its tokens with the real model
  on the CPU (they must be real for the run to learn); that compute stands in for the
  accelerator's, so the threads that generate run under ``SCHED_IDLE``: they take only cycles
  the trainer leaves idle, where on separate GPUs they would take none. (``nice 19`` was not
  enough: Ray starts its workers, the train cells included, at nice 15, and against nice 15 a
  nice-19 engine still took about a third of a core.) The engine's control calls (pause, load,
  stamp, resume) keep the normal priority, as an engine's host CPU would serve them.
  :class:`DeviceLatencyEngine` is a benchmark double.

Modes (``MODES``): ``sync`` (no overlap, on-policy: the baseline), ``async`` (fully-async, a
weight update aborts generation in flight), ``async+partial`` (fully-async with partial rollout:
in-flight samples continue under the new weights). Admission control is on in every mode. A
mode label may end in ``@S`` to run it with ``max_weight_staleness = S`` (``async+partial@1``),
then in ``~W`` to run it with ``weight_swap = W`` (``async+partial~pause``);
:func:`expand_modes` builds those labels.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from orchestrator.metric_keys import FULLY_ASYNC_PREFIX, REWARD_KEY
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.driver import JobOptions, run_job

__all__ = [
    "MODES",
    "WARMUP_STEPS",
    "DeviceLatencyEngine",
    "RunStats",
    "engine_factory",
    "expand_modes",
    "is_sync",
    "run_mode",
    "run_stats",
    "time_to_reward",
]

WARMUP_STEPS = 3
MODES: dict[str, dict[str, Any]] = {
    "sync": {"sync": True, "partial_rollout": False},
    "async": {"sync": False, "partial_rollout": False},
    "async+partial": {"sync": False, "partial_rollout": True},
}
P = FULLY_ASYNC_PREFIX
_REJECTED = ("stale_filtered", "aborted_filtered", "dynamic_filtered", "partial_span_filtered")


class DeviceLatencyEngine(RolloutEngine):
    """A RolloutEngine whose every decode step also waits, without holding a core, for the
    next tick of a ``device_s_per_token`` clock: the batched step an accelerator of its own
    would run."""

    device_s_per_token = 0.015

    def _generate(self, *args: Any, **kwargs: Any) -> list[Any]:
        # One group's body, on the thread that generates it: a single call's, or a batch's.
        _run_on_idle_cycles_only()  # this generating thread, from now on
        return super()._generate(*args, **kwargs)

    def _forward_step(self, tokens: Any, decoder: Any) -> Any:
        logits = super()._forward_step(tokens, decoder)  # the device's work, done on the CPU
        step = self.device_s_per_token
        time.sleep(step - time.monotonic() % step)  # the rest of this device step
        return logits


def _run_on_idle_cycles_only() -> None:
    """Put the calling thread under ``SCHED_IDLE`` (on Linux a scheduling policy is per
    thread); where that policy does not exist, leave it as it is."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def engine_factory(setup: str, ms_per_token: float = 15.0):
    """An ``engine_factory`` for :class:`JobOptions`: ``cpu`` (the built-in engines) or
    ``device`` (:class:`DeviceLatencyEngine` at ``ms_per_token``)."""
    if setup == "cpu":
        return launch.create_engine
    if setup != "device":
        raise ValueError(f"unknown engine set-up {setup!r}")
    # Ray workers cannot import this script directory: ship the class by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    engine_class = type("DeviceEngine", (DeviceLatencyEngine,),
                        {"device_s_per_token": ms_per_token / 1000.0})

    def create(config: RunConfig, engine_id: str):
        scheduling = getattr(launch, "scheduling_options", dict)()
        options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": launch.ENGINE_CPUS, **scheduling}
        sampling = {"temperature": config.temperature, "top_p": config.top_p,
                    "max_new_tokens": config.max_response_len}
        return ray.remote(**options)(engine_class).remote(
            engine_id, config.backend, launch.policy_config(config), seed=config.seed,
            task=launch.task_for(config), sampling=sampling,
            partial_rollout=config.partial_rollout,
        )

    return create


def expand_modes(modes: list[str], staleness: list[int] | None,
                 weight_swaps: list[str] | None = None) -> list[str]:
    """Mode labels: each async mode once per ``staleness`` value (``async@1``) and per
    ``weight_swaps`` value (``async~pause``); sync once (nothing generates during its
    updates, so how engines take them does not matter)."""
    labels: list[str] = []
    for mode in modes:
        for value in ([None] if mode == "sync" or not staleness else staleness):
            for swap in ([None] if mode == "sync" or not weight_swaps else weight_swaps):
                label = mode if value is None else f"{mode}@{value}"
                label = label if swap is None else f"{label}~{swap}"
                if label not in labels:
                    labels.append(label)
    return labels


def is_sync(label: str) -> bool:
    """True for the synchronous baseline's label."""
    return label.partition("~")[0].partition("@")[0] == "sync"


def run_mode(base: RunConfig, mode: str, runs_dir: Path, factory, run_id: str
             ) -> list[dict[str, Any]]:
    """Run ``base`` in ``mode`` (a label, see :func:`expand_modes`) to the end; returns its
    metrics lines (one per step).

    Raises:
        RuntimeError: the run's audit found a problem or a negative staleness.
    """
    label, _, swap = mode.partition("~")
    name, _, staleness = label.partition("@")
    update: dict[str, Any] = {"run_id": run_id, **MODES[name]}
    if staleness:
        update["max_weight_staleness"] = int(staleness)
    if swap:
        update["weight_swap"] = swap
    config = base.model_copy(update=update)
    result = run_job(config, JobOptions(runs_dir=runs_dir, progress=False, plot=False,
                                        engine_factory=factory))
    if not result.ok:
        raise RuntimeError(f"run {run_id} failed its audit: {result.audit_problems}")
    return [json.loads(line) for line in result.metrics_path.read_text().splitlines()]


@dataclass(frozen=True)
class RunStats:
    """What one run's metrics say, over the steps after the warm-up (rates) or all (waste)."""

    s_per_step: float
    samples_per_s: float
    waste_groups: float  # groups screened out / groups generated (screened)
    waste_tokens: float  # response tokens of screened-out groups / all screened tokens
    generate_s: float  # mean drain wait per step (all generation in sync mode)
    train_s: float
    update_s: float
    staleness_avg: float  # at the drain, as the screen measured it
    train_staleness_avg: float  # as the loss saw it (fully-async: up to one more)
    mixed_version_ratio: float
    held_back: int
    final_reward: float

    @property
    def overlap_bound(self) -> float:
        """``max(generate, train + update) / (generate + train + update)``: the best ratio
        of async to sync time per step that perfect overlap of these phases can give."""
        total = self.generate_s + self.train_s + self.update_s
        return max(self.generate_s, self.train_s + self.update_s) / total if total else 1.0


def run_stats(records: list[dict[str, Any]], warmup: int = WARMUP_STEPS) -> RunStats:
    """Summarise one run's metrics lines."""
    measured = records[warmup:] if len(records) > warmup else records

    def total(key: str, rows=records) -> float:
        return float(sum(r.get(key, 0) or 0 for r in rows))

    def mean(key: str, rows=measured) -> float:
        return total(key, rows) / len(rows)

    trained, rejected = total(P + "trained"), sum(total(P + k) for k in _REJECTED)
    tokens_trained, discarded = total(P + "tokens_trained"), total(P + "tokens_discarded")
    seconds = total("step_s", measured)
    return RunStats(
        s_per_step=seconds / len(measured),
        samples_per_s=total("samples", measured) / seconds,
        waste_groups=rejected / (trained + rejected) if trained + rejected else 0.0,
        waste_tokens=discarded / (tokens_trained + discarded) if tokens_trained else 0.0,
        generate_s=mean("time/drain_wait_s"),
        train_s=mean("time/train_s"),
        update_s=mean("time/update_weights_s"),
        staleness_avg=mean(P + "staleness_avg", records),
        train_staleness_avg=mean(P + "train_staleness_avg", records),
        mixed_version_ratio=mean(P + "mixed_version_ratio", records),
        held_back=int(total(P + "admission_held_back")),
        final_reward=statistics.fmean(r[REWARD_KEY] for r in records[-5:]),
    )


def time_to_reward(records: list[dict[str, Any]], threshold: float, window: int = 5
                   ) -> tuple[int | None, float | None]:
    """The first step at which the rolling mean reward (over ``window`` steps) reaches
    ``threshold``, and the wall seconds from the end of step 1 to the end of that step (the
    start-up and the first drain, the same in every mode, are left out). ``(None, None)`` if
    the run never gets there."""
    rewards = [r[REWARD_KEY] for r in records]
    for end in range(window, len(rewards) + 1):
        if statistics.fmean(rewards[end - window:end]) >= threshold:
            return records[end - 1]["step"], records[end - 1]["wall_s"] - records[0]["wall_s"]
    return None, None
