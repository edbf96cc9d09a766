"""The chaos campaigns of ``make chaos``: many seeds on SQLite and PostgreSQL, one table.

Usage::

    python bench/chaos.py [--sqlite-seeds 20] [--postgres-seeds 5] [--steps 200]
                          [--pg-url URL] [--local-nodes 3] [--reward-tolerance 0.2]
                          [--runs-dir DIR] [--overlap]

Runs each campaign in turn (``orchestrator chaos`` one seed at a time,
:func:`orchestrator.chaos.campaign.run_campaign`): SQLite seeds 1..N and PostgreSQL seeds
101..100+M on a local multi-node cluster of ``--local-nodes`` worker nodes (so ``kill-node``
is in the draw), the PostgreSQL ones spread evenly among the SQLite ones (a run cut short still
has both), and prints one table: every campaign's line (steps, faults fired, breaches, final
reward against the fault-free run of its seed), then the faults by kind over all of them
(planned, planned into a recovery, fired, fired inside an earlier fault's recovery, recovered,
recovery p50/p99), then every breach with the fault it followed. The table so far is also
written to ``RUNS_DIR/table.txt`` after every campaign. Exit 1 if any campaign has a breach.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

from orchestrator.chaos.campaign import CampaignOptions, run_campaign  # noqa: E402
from orchestrator.render import ChaosTable  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POSTGRES_FIRST_SEED = 101


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-seeds", type=int, default=20)
    parser.add_argument("--postgres-seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--mean-interval", type=float, default=10.0)
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--local-nodes", type=int, default=3)
    parser.add_argument("--reward-tolerance", type=float, default=None)
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args()
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    base = CampaignOptions(steps=args.steps, mean_interval=args.mean_interval,
                           overlap=args.overlap, reward_tolerance=args.reward_tolerance,
                           runs_dir=runs_dir)
    sqlite = [CampaignOptions(**{**base.__dict__, "seed": seed})
              for seed in range(1, args.sqlite_seeds + 1)]
    postgres = [CampaignOptions(**{**base.__dict__, "seed": seed, "db": args.pg_url,
                                   "local_nodes": args.local_nodes})
                for seed in range(POSTGRES_FIRST_SEED, POSTGRES_FIRST_SEED
                                  + args.postgres_seeds)]
    table = ChaosTable()
    for options in interleaved(sqlite, postgres):
        result = run_campaign(options)
        print(f"seed {options.seed} ({'postgresql' if options.db else 'sqlite'}): "
              f"{'pass' if result.ok else 'FAIL'}, {len(result.fired)} faults, "
              f"{len(result.verdict.breaches)} breaches, {result.wall_s:.0f} s", flush=True)
        table.add(result)
        with (runs_dir / "table.txt").open("w") as sink:
            table.print(sink)
    table.print()
    print(f"runs: {runs_dir}")
    return 0 if all(result.ok for result in table.results) else 1


def interleaved(many: list[CampaignOptions], few: list[CampaignOptions]
                ) -> list[CampaignOptions]:
    """``many`` in order with ``few`` spread evenly among them, each after its share."""
    if not few:
        return list(many)
    order: list[CampaignOptions] = []
    share = len(many) / len(few)
    for position, options in enumerate(few):
        order += many[round(position * share):round((position + 1) * share)]
        order.append(options)
    return order


if __name__ == "__main__":
    sys.exit(main())
