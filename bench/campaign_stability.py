"""Does the chaos campaigns' job learn steadily without faults? Fault-free runs per learning rate.

Usage::

    python bench/campaign_stability.py [--lr 3e-3 1e-3] [--seeds 1-20] [--steps 200]
                                       [--runs-dir DIR] [--quick]

The learning check of a campaign (``--reward-tolerance``) compares its final reward with one
fault-free run of the same seed, so it is only as good as that job is stable: a job that
collapses on its own, faults or none, raises false alarms and hides real losses. This runs the
campaign's job (:func:`orchestrator.chaos.campaign.campaign_config`, the same process entry as
a campaign's fault-free run) for every seed at each learning rate, the rates alternating and
rotated per seed, and prints per rate: the final reward (mean of the last 5 steps: median,
min, max), how many runs ended collapsed (final reward below ``COLLAPSED_BELOW``), and the
largest one-step KL between the trainer and the behaviour policy (the spikes that precede a
collapse), with how many runs had one above ``KL_SPIKE``; then every run. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

from _report import COLLAPSED_BELOW, machine_line, median_spread, rotated, seed_list  # noqa: E402
from ledger.run_layout import REWARD_KEY, STEP_KEY, RunLayout  # noqa: E402
from orchestrator.chaos.campaign import CampaignOptions, campaign_config  # noqa: E402
from orchestrator.chaos.history import REWARD_WINDOW  # noqa: E402
from orchestrator.chaos.job_process import JobSpec, write_spec  # noqa: E402

KL_SPIKE = 1.0
BEHAVIOUR_KL_KEY = "train/off_policy/behaviour_kl_k3"


@dataclass(frozen=True)
class FaultFreeRun:
    """One fault-free run: its learning rate, seed, final reward and largest one-step KL."""

    lr: float
    seed: int
    final_reward: float
    max_kl: float
    wall_s: float


def run_fault_free(lr: float, seed: int, steps: int, runs_dir: Path) -> FaultFreeRun:
    """Run the campaign job of ``seed`` at ``lr`` without faults, in a process of its own."""
    run_id = f"stability-lr{lr:g}-s{seed}"
    layout = RunLayout.of(runs_dir, run_id)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    options = CampaignOptions(steps=steps, seed=seed, runs_dir=runs_dir)
    config = campaign_config(options, run_id, RunLayout.of(runs_dir.resolve(), run_id).ledger_url)
    spec = write_spec(layout.run_dir / "job.json", JobSpec(
        config=config.model_copy(update={"lr": lr}).model_dump(mode="json"),
        runs_dir=str(runs_dir), resume=False, schedule=[], seed=seed))
    with (layout.run_dir / "job.log").open("w") as log:
        finished = subprocess.run([sys.executable, "-m", "orchestrator.chaos.job_process",
                                   str(spec)], stdout=log, stderr=subprocess.STDOUT, check=False)
    if finished.returncode != 0:
        raise SystemExit(f"the run of seed {seed} at lr {lr:g} exited {finished.returncode}: "
                         f"see {layout.run_dir / 'job.log'}")
    records = [json.loads(line) for line in layout.metrics_path.read_text().splitlines()
               if line.strip()]
    records = [r for r in records if isinstance(r.get(STEP_KEY), int)]
    rewards = [float(r[REWARD_KEY]) for r in records if REWARD_KEY in r]
    return FaultFreeRun(
        lr=lr, seed=seed, final_reward=statistics.fmean(rewards[-REWARD_WINDOW:]),
        max_kl=max(float(r.get(BEHAVIOUR_KL_KEY, 0.0)) for r in records),
        wall_s=float(records[-1].get("wall_s", 0.0)),
    )


def print_report(runs: list[FaultFreeRun], steps: int) -> None:
    """A markdown table with one line per learning rate, then one with every run."""
    print(f"Fault-free runs of the campaign job, {steps} steps; {machine_line()}")
    print(f"| lr | runs | final reward median (min-max) | collapsed (< {COLLAPSED_BELOW}) "
          f"| largest KL median (max) | runs with KL > {KL_SPIKE:g} |")
    print("|---|---|---|---|---|---|")
    for lr in sorted({run.lr for run in runs}, reverse=True):
        of_lr = [run for run in runs if run.lr == lr]
        final, low, high = median_spread([run.final_reward for run in of_lr])
        kl, _, kl_max = median_spread([run.max_kl for run in of_lr])
        collapsed = sorted(run.seed for run in of_lr if run.final_reward < COLLAPSED_BELOW)
        seeds = (f" (seed{'s' if len(collapsed) > 1 else ''} {', '.join(map(str, collapsed))})"
                 if collapsed else "")
        spikes = sum(run.max_kl > KL_SPIKE for run in of_lr)
        print(f"| {lr:g} | {len(of_lr)} | {final:.3f} ({low:.3f}-{high:.3f}) "
              f"| {len(collapsed)}{seeds} | {kl:.3f} ({kl_max:.2f}) | {spikes} |")
    print()
    print("| seed | lr | final reward | largest KL | wall s |")
    print("|---|---|---|---|---|")
    for run in sorted(runs, key=lambda r: (r.seed, -r.lr)):
        print(f"| {run.seed} | {run.lr:g} | {run.final_reward:.3f} | {run.max_kl:.3f} "
              f"| {run.wall_s:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, nargs="+", default=[3e-3, 1e-3])
    parser.add_argument("--seeds", type=seed_list, default=seed_list("1-20"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: seed 1, 6 steps, both default rates")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = [1], 6
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="stability-"))
    runs = [run_fault_free(lr, seed, args.steps, runs_dir)
            for round_index, seed in enumerate(sorted(args.seeds))
            for lr in rotated(args.lr, round_index)]
    print_report(runs, args.steps)
    print(f"runs: {runs_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
