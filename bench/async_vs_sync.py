"""Fully-async against --sync on the same short run: time per step, waste, the overlap bound.

    python bench/async_vs_sync.py [--steps 30] [--repeats 3] [--engines cpu device]
                                  [--device-ms-per-token 15] [--kills 3] [--quick]

Three modes (``sync``, ``async``, ``async+partial``, see ``bench/_jobs.py``) run the same
config on one local Ray cluster, in alternating order (the order rotates every repeat), at
least ``--repeats`` times each, side by side, for each engine set-up (``cpu``: the built-in
engines on the trainer's cores; ``device``: engines that model their own accelerator). Per
run: seconds per step and trained samples per second over the steps after a warm-up, and the
waste (groups, and response tokens, generated but screened out instead of trained, over all
generated). Per mode: the median and the spread (min-max) over the repeats.

The overlap bound comes from the sync runs' phase timings (median over repeats):
``max(generate, train + update) / (generate + train + update)``, the best async/sync ratio
that overlapping generation with training and the update could give. "vs bound" is the async
ratio divided by it (1.00 = all the overlap there is).

``--kills N`` also SIGKILLs the publisher N times in one fully-async run and reports the time
from each kill to the next ``weight_committed`` in the ledger.

Prints tables; asserts nothing (benchmarks on a shared machine are noisy: read the spread).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import ray

from _jobs import MODES, engine_factory, expand_modes, is_sync, run_mode, run_stats
from _report import machine_line, median_spread, rotated
from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.control.driver import JobOptions, TrainingJob, run_job


def measure_failover(base: RunConfig, kills: int, runs_dir: Path) -> list[float]:
    """Seconds from each publisher SIGKILL to the next committed version."""
    kill_steps = {4 + 5 * i for i in range(kills)}
    killed_at: list[datetime] = []

    def kill_publisher(job: TrainingJob, step: int) -> None:
        if step in kill_steps:
            publisher = job.ledger.head(job.run_id).publisher_cell
            pid = ray.get(job.supervisor.cells.actor(publisher).pid.remote())
            killed_at.append(datetime.now(UTC).replace(tzinfo=None))
            os.kill(pid, signal.SIGKILL)

    config = base.model_copy(update={"run_id": "bench-failover",
                                     "num_rollout": max(kill_steps) + 4})
    result = run_job(config, JobOptions(runs_dir=runs_dir, progress=False, plot=False,
                                        on_step=kill_publisher))
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        commits = [e.recorded_at for e in ledger.events(config.run_id)
                   if e.kind == "weight_committed"]
    return [
        (min(c for c in commits if c > kill) - kill).total_seconds() for kill in killed_at
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", choices=["cpu", "device"],
                        default=["cpu", "device"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--staleness", type=int, nargs="+", default=None,
                        help="run each async mode at each of these max_weight_staleness values "
                             "(default: the RunConfig default only)")
    parser.add_argument("--weight-swaps", nargs="+", choices=["pause", "in-flight"],
                        default=None, help="run each async mode with each of these "
                        "--weight-swap values (default: the RunConfig default only)")
    parser.add_argument("--device-ms-per-token", type=float, default=15.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--backend", choices=["torch", "megatron"], default="torch")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 6 steps, 1 repeat, device engines, no kills")
    args = parser.parse_args()
    args.modes = expand_modes(args.modes, args.staleness, args.weight_swaps)
    if args.quick:
        args.steps, args.repeats, args.engines, args.kills = 6, 1, ["device"], 0
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

    print(f"{machine_line()}; backend {args.backend}, {args.steps} steps per run, "
          f"{args.repeats} repeats per mode, device engines {args.device_ms_per_token:g} ms "
          "per decode step")
    base = RunConfig(num_rollout=args.steps, backend=args.backend, save_interval=10**6,
                     heartbeat_timeout_s=10.0)
    stats: dict[tuple[str, str], list] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp)
        for repeat in range(args.repeats):
            for engines in args.engines:
                factory = engine_factory(engines, args.device_ms_per_token)
                for mode in rotated(args.modes, repeat):
                    run_id = f"bench-{engines}-{_slug(mode)}-{repeat}"
                    records = run_mode(base, mode, runs_dir, factory, run_id)
                    stats.setdefault((engines, mode), []).append(run_stats(records))
                    row = stats[(engines, mode)][-1]
                    print(f"  repeat {repeat} {engines:6} {mode:14} {row.s_per_step:.3f} s/step "
                          f"waste {row.waste_groups:.1%} (phases: drain wait "
                          f"{row.generate_s:.3f} s, train {row.train_s:.3f} s, update "
                          f"{row.update_s:.3f} s)", flush=True)
        print_table(args, stats)
        recoveries = measure_failover(base, args.kills, runs_dir) if args.kills else []
    total = time.monotonic() - started
    if recoveries:
        print(f"\npublisher death -> next commit over {len(recoveries)} kills: "
              f"median {statistics.median(recoveries):.2f} s, max {max(recoveries):.2f} s")
    print(f"(bench wall time {total:.0f} s)")


def _slug(mode: str) -> str:
    return mode.replace("+", "-").replace("@", "-s").replace("~", "-")


def print_table(args: argparse.Namespace, stats: dict[tuple[str, str], list]) -> None:
    """The results table: per engine set-up and mode, medians and spreads, and the bound."""
    print()
    print("| engines | mode | s/step median (min-max) | samples/s median | waste groups | "
          "waste tokens | staleness avg, drain / train | async/sync median (paired min-max) | "
          "vs bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for engines in args.engines:
        sync_rows = stats.get((engines, "sync"))
        bound = None
        if sync_rows:
            generate = statistics.median(r.generate_s for r in sync_rows)
            train = statistics.median(r.train_s for r in sync_rows)
            update = statistics.median(r.update_s for r in sync_rows)
            bound = max(generate, train + update) / (generate + train + update)
        for mode in args.modes:
            rows = stats[(engines, mode)]
            median, low, high = median_spread([r.s_per_step for r in rows])
            ratio_text = vs_bound = "-"
            if sync_rows and not is_sync(mode):
                ratio = median / statistics.median(r.s_per_step for r in sync_rows)
                paired = [a.s_per_step / s.s_per_step for a, s in zip(rows, sync_rows)]
                ratio_text = f"{ratio:.2f} ({min(paired):.2f}-{max(paired):.2f})"
                vs_bound = f"{ratio / bound:.2f}" if bound else "-"
            print(f"| {engines} | {mode} | {median:.3f} ({low:.3f}-{high:.3f}) | "
                  f"{statistics.median(r.samples_per_s for r in rows):.0f} | "
                  f"{statistics.median(r.waste_groups for r in rows):.1%} | "
                  f"{statistics.median(r.waste_tokens for r in rows):.1%} | "
                  f"{statistics.median(r.staleness_avg for r in rows):.2f} / "
                  f"{statistics.median(r.train_staleness_avg for r in rows):.2f} | "
                  f"{ratio_text} | {vs_bound} |")
        if sync_rows:
            print(f"| {engines} | overlap bound (sync phases: generate {generate:.3f} s, "
                  f"train {train:.3f} s, update {update:.3f} s) | | | | | | {bound:.2f} | 1.00 |",
                  flush=True)


if __name__ == "__main__":
    main()
