"""Time to a reward: sync against fully-async (without and with partial rollout).

    python bench/time_to_reward.py [--steps 100] [--seeds 1 2 3] [--threshold 0.4]
                                   [--engines cpu device] [--device-ms-per-token 15] [--quick]
                                   [--corrections none decoupled tis]
                                   [--tis-cap 5] [--tis-clip-low 0.5]
                                   [--weight-swaps pause in-flight]

What a user buys fully-async for is reaching a given reward sooner, not steps per second. On
the default task and config, each mode (``sync``, ``async``, ``async+partial``; see
``bench/_jobs.py``) runs once per seed, in alternating order (the order rotates every seed),
for each engine set-up. Per run: the steps and the wall seconds until the rolling mean reward
(window 5) first reaches ``--threshold`` (seconds from the end of step 1, so the start-up and
the first drain, the same in every mode, are left out), and the final reward (mean of the last
5 steps). Per mode: medians over the seeds, the ratios of the medians to sync's, and the seeds
whose run collapsed (final reward below ``COLLAPSED_BELOW``): a mode that reaches the
threshold sooner but collapses more often is not a better default.
``--corrections`` runs each async mode once per ``--off-policy-correction`` (label
``async/decoupled``; sync, on-policy, runs with the RunConfig default), alternating with the rest.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _jobs import (
    MODES,
    engine_factory,
    expand_modes,
    is_sync,
    run_mode,
    run_stats,
    time_to_reward,
)
from _report import COLLAPSED_BELOW, machine_line, rotated
from orchestrator.config import RunConfig


def with_corrections(modes: list[str], corrections: list[str] | None) -> list[str]:
    """Each async mode label once per correction (``async/decoupled``); sync once, as is."""
    if not corrections:
        return list(modes)
    return [m if is_sync(m) else f"{m}/{c}" for m in modes
            for c in ([None] if is_sync(m) else corrections)]


def _median(values: list[float | None]) -> float | None:
    """The median of the runs that got there; None if fewer than half did."""
    reached = [v for v in values if v is not None]
    return statistics.median(reached) if len(reached) * 2 > len(values) else None


def _text(value: float | None, form: str) -> str:
    return "never" if value is None else format(value, form)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threshold", type=float, default=0.4)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--engines", nargs="+", choices=["cpu", "device"],
                        default=["cpu", "device"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--staleness", type=int, nargs="+", default=None,
                        help="run each async mode at each of these max_weight_staleness values "
                             "(default: the RunConfig default only)")
    parser.add_argument("--corrections", nargs="+", choices=["none", "decoupled", "tis"],
                        default=None, help="run each async mode with each of these "
                        "off-policy corrections (default: the RunConfig default only)")
    parser.add_argument("--weight-swaps", nargs="+", choices=["pause", "in-flight"],
                        default=None, help="run each async mode with each of these "
                        "--weight-swap values (default: the RunConfig default only)")
    parser.add_argument("--tis-cap", type=float, default=None,
                        help="the corrections' --tis-cap (default: the RunConfig default)")
    parser.add_argument("--tis-clip-low", type=float, default=None,
                        help="tis's --tis-clip-low (default: the RunConfig default)")
    parser.add_argument("--device-ms-per-token", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 12 steps, seed 1, threshold 0.05, device engines")
    args = parser.parse_args()
    args.modes = with_corrections(expand_modes(args.modes, args.staleness, args.weight_swaps),
                                  args.corrections)
    if args.quick:
        args.steps, args.seeds, args.threshold, args.engines = 12, [1], 0.05, ["device"]
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

    print(f"{machine_line()}; {args.steps} steps per run, seeds {args.seeds}, threshold "
          f"{args.threshold:g} (rolling mean over {args.window} steps), device engines "
          f"{args.device_ms_per_token:g} ms per decode step")
    results: dict[tuple[str, str], list[tuple[int | None, float | None, float, float]]] = {}
    bounds = {name: value for name, value in (("tis_cap", args.tis_cap),
                                              ("tis_clip_low", args.tis_clip_low))
              if value is not None}  # the RunConfig defaults where not given
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for index, seed in enumerate(args.seeds):
            base = RunConfig(num_rollout=args.steps, seed=seed, save_interval=10**6, **bounds)
            for engines in args.engines:
                factory = engine_factory(engines, args.device_ms_per_token)
                for mode in rotated(args.modes, index):
                    label, _, correction = mode.partition("/")
                    slug = (mode.replace("+", "-").replace("@", "-s").replace("/", "-")
                            .replace("~", "-"))
                    config = (base.model_copy(update={"off_policy_correction": correction})
                              if correction else base)
                    records = run_mode(config, label, Path(tmp), factory,
                                       f"ttr-{engines}-{slug}-seed{seed}")
                    steps, seconds = time_to_reward(records, args.threshold, args.window)
                    stats = run_stats(records)
                    results.setdefault((engines, mode), []).append(
                        (steps, seconds, stats.final_reward, stats.s_per_step))
                    print(f"  seed {seed} {engines:6} {mode:22} reached at step "
                          f"{_text(steps, 'd')} ({_text(seconds, '.1f')} s), final reward "
                          f"{stats.final_reward:.3f}, {stats.s_per_step:.3f} s/step, "
                          f"staleness avg {stats.staleness_avg:.2f} at the drain, "
                          f"{stats.train_staleness_avg:.2f} at train", flush=True)
    total = time.monotonic() - started

    print()
    print(f"| engines | mode | steps to {args.threshold:g} (median, per seed) | seconds to "
          f"{args.threshold:g} (median) | time ratio to sync | final reward (median) | "
          f"final ratio to sync | collapsed (final < {COLLAPSED_BELOW:g}) | s/step (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for engines in args.engines:
        sync = results.get((engines, "sync"))
        sync_seconds = _median([r[1] for r in sync]) if sync else None
        sync_final = statistics.median(r[2] for r in sync) if sync else None
        for mode in args.modes:
            rows = results[(engines, mode)]
            steps = _median([r[0] for r in rows])
            seconds = _median([r[1] for r in rows])
            final = statistics.median(r[2] for r in rows)
            per_seed = ", ".join(_text(r[0], "d") for r in rows)
            time_ratio = (f"{seconds / sync_seconds:.2f}" if seconds and sync_seconds
                          and not is_sync(mode) else "-")
            final_ratio = f"{final / sync_final:.2f}" if sync_final and not is_sync(mode) else "-"
            collapsed = [str(seed) for seed, row in zip(args.seeds, rows)
                         if row[2] < COLLAPSED_BELOW]
            collapsed_text = (f"{len(collapsed)} of {len(rows)}"
                              + (f" (seed {', '.join(collapsed)})" if collapsed else ""))
            print(f"| {engines} | {mode} | {_text(steps, '.0f')} ({per_seed}) | "
                  f"{_text(seconds, '.1f')} | {time_ratio} | {final:.3f} | {final_ratio} | "
                  f"{collapsed_text} | {statistics.median(r[3] for r in rows):.3f} |")
    print(f"(bench wall time {total:.0f} s)")


if __name__ == "__main__":
    main()
