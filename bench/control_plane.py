"""The control plane's cost per step, phase by phase, with and without batched engine calls.

    python bench/control_plane.py [--steps 40] [--repeats 3] [--groups-per-call 1 8]
                                  [--weight-swaps pause in-flight]
                                  [--engines cpu device] [--quick]

Runs the default job (fully-async, partial rollout) once per ``--engine-call-max-groups``
value and ``--weight-swap`` value per repeat, the set-ups alternating (the order rotated each
repeat), and prints, per set-up, medians over the runs (min-max) of each run's median step
after the warm-up:

- step time, and the control plane's share of it (``time/control_plane_s``: the step less the
  train step and the drain wait, so ledger transactions, Ray round trips, weight staging and
  bookkeeping);
- every phase of the step (``time/*_s``) and of the weight update (``time/update/*_s``; the
  engines' stamp and ``engines_stamped`` run on the publisher's update tail beside the next
  train step, and ``tail_wait`` is the next update's wait for them);
- the rollout manager's CPU per step, its share of a core, and its engine calls per step.

``--engines device`` uses the benchmark's modelled-accelerator engines (``bench/_jobs.py``).
Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _jobs import WARMUP_STEPS, engine_factory, run_mode
from _report import machine_line, median_spread, rotated
from orchestrator.config import RunConfig
from orchestrator.metric_keys import FULLY_ASYNC_PREFIX

P = FULLY_ASYNC_PREFIX
# (label, metrics key, scale): what each row of the table shows, per step.
ROWS: list[tuple[str, str, float]] = [
    ("step (ms)", "step_s", 1000),
    ("control plane (ms)", "time/control_plane_s", 1000),
    ("drain wait (ms)", "time/drain_wait_s", 1000),
    ("begin step: heartbeat, probe (ms)", "time/begin_step_s", 1000),
    ("train (ms)", "time/train_s", 1000),
    ("weight update (ms)", "time/update_weights_s", 1000),
    *[(f"  update: {name} (ms)", f"time/update/{name}_s", 1000)
      for name in ("started", "stage", "pause", "load", "commit", "hand_over", "tail_wait")],
    ("provenance (ms)", "time/provenance_s", 1000),
    ("end of step (ms)", "time/end_step_s", 1000),
    ("manager CPU (ms)", P + "manager_cpu_s", 1000),
    ("manager CPU share of a core", P + "manager_cpu_share", 1),
    ("engine calls", P + "engine_calls", 1),
    ("groups per engine call", P + "groups_per_engine_call", 1),
]


def run_medians(records: list[dict[str, Any]]) -> dict[str, float]:
    """Each row's median over the run's steps after the warm-up (steps missing a key skip)."""
    measured = records[WARMUP_STEPS:]
    medians = {}
    for _, key, _ in ROWS:
        values = [float(r[key]) for r in measured if r.get(key) is not None]
        if values:
            medians[key] = statistics.median(values)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups-per-call", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--weight-swaps", nargs="+", choices=["pause", "in-flight"],
                        default=[RunConfig().weight_swap])
    parser.add_argument("--engines", choices=["cpu", "device"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke run: 6 steps, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 6, 1
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    print(f"control plane: {machine_line()}; default job, {args.engines} engines, "
          f"{args.steps} steps per run, {args.repeats} repeats, warm-up {WARMUP_STEPS} steps")
    base = RunConfig(num_rollout=args.steps, save_interval=10**6)
    factory = engine_factory(args.engines)
    setups = [(groups, swap) for groups in args.groups_per_call for swap in args.weight_swaps]
    runs: dict[str, list[dict[str, float]]] = {_label(*setup): [] for setup in setups}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for groups, swap in rotated(setups, repeat):
                config = base.model_copy(update={"engine_call_max_groups": groups,
                                                 "weight_swap": swap})
                records = run_mode(config, "async+partial", Path(tmp), factory,
                                   f"bench-cp-{groups}-{swap}-{repeat}")
                label = _label(groups, swap)
                runs[label].append(run_medians(records))
                row = runs[label][-1]
                print(f"  repeat {repeat} {label}: step "
                      f"{1000 * row['step_s']:.1f} ms, control plane "
                      f"{1000 * row['time/control_plane_s']:.1f} ms, manager CPU share "
                      f"{row.get(P + 'manager_cpu_share', float('nan')):.2f}", flush=True)
    print_table(runs)
    print(f"(bench wall time {time.monotonic() - started:.0f} s)")


def _label(groups: int, swap: str) -> str:
    return f"{groups} group(s) per call, {swap}"


def print_table(runs: dict[str, list[dict[str, float]]]) -> None:
    """One column per set-up (groups per call, weight swap): median (min-max) over its runs."""
    values = list(runs)
    print("\n| per step | " + " | ".join(values) + " |")
    print("|---|" + "---|" * len(values))
    for label, key, scale in ROWS:
        cells = []
        for value in values:
            found = [run[key] * scale for run in runs[value] if key in run]
            if not found:
                cells.append("-")
                continue
            median, low, high = median_spread(found)
            digits = 2 if scale == 1 else 1
            cells.append(f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
