"""Recovery time per drill scenario, beside Ray's own actor-death detection time.

Usage::

    python bench/failover.py [--repeat 3] [--db URL] [--scenario NAME ...]

For each scenario, runs the drill ``--repeat`` times (chaos mode, seeded) and reports the median
and max of the recovery time (fault to the next ``weight_committed`` in the ledger) next to the
detection time measured in the same run: SIGKILL to the ``ActorDiedError`` a call on the dead
actor sees (Ray's detection), or, for the frozen publisher, the heartbeat timeout that declared
it lost. Every drill must pass; a failed one is reported and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

from orchestrator.drills import DrillOptions, DrillResult, plan_drills, run_drill  # noqa: E402

DEFAULT_SCENARIOS = [
    "kill-publisher-mid-train",
    "kill-publisher-mid-transfer",
    "kill-publisher-after-commit",
    "zombie-publisher",
    "double-failover",
    "kill-follower",
    "kill-engine",
    "kill-rollout-manager",
]


def _detect_s(result: DrillResult) -> float | None:
    detail = result.detail
    value = detail.get("ray_detect_s", detail.get("heartbeat_detect_s"))
    return None if value is None else float(value)


def _fmt(values: list[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.3f}", f"{max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--db", default=None, help="ledger URL (default: SQLite per drill)")
    parser.add_argument("--scenario", action="append", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    scenarios = args.scenario or DEFAULT_SCENARIOS
    runs_dir = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    options = DrillOptions(runs_dir=runs_dir, db=args.db, seed=args.seed)
    results: dict[str, list[DrillResult]] = {name: [] for name in scenarios}
    started = time.monotonic()
    for plan in plan_drills(scenarios, seed=args.seed, repeat=args.repeat):
        result = run_drill(plan, options)
        results[plan.scenario].append(result)
        print(f"  {plan.scenario:<30} step {plan.step + 1} {plan.point:<15} "
              f"recover {result.recover_s}s  {'pass' if result.passed else 'FAIL'}",
              file=sys.stderr, flush=True)

    backend = (args.db or "sqlite").split(":", 1)[0].split("+", 1)[0]
    print(f"\nfailover drills, backend {backend}, {args.repeat} repeats, seed {args.seed}, "
          f"{os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s total\n")
    print("| scenario | passed | recover median s | recover max s | detect median s "
          "| detect max s | detected by |")
    print("|---|---|---|---|---|---|---|")
    failed = 0
    for name, runs in results.items():
        recover = [r.recover_s for r in runs if r.recover_s is not None]
        detect = [d for d in (_detect_s(r) for r in runs) if d is not None]
        passed = sum(r.passed for r in runs)
        failed += len(runs) - passed
        by = ("heartbeat timeout" if name == "zombie-publisher"
              else "Ray ActorDiedError" if detect else "-")
        print(f"| {name} | {passed}/{len(runs)} | {' | '.join(_fmt(recover))} | "
              f"{' | '.join(_fmt(detect))} | {by} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
