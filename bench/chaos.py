"""The chaos campaigns of ``make chaos``: many seeds on SQLite and PostgreSQL, one table.

Usage::

    python bench/chaos.py [--sqlite-seeds 20] [--postgres-seeds 5] [--steps 200]
                          [--pg-url URL] [--local-nodes 3] [--reward-tolerance 0.2]
                          [--runs-dir DIR] [--overlap] [--only SEEDS]
    python bench/chaos.py --table-from DIR [DIR ...]

Runs each campaign in turn (``orchestrator chaos`` one seed at a time,
:func:`orchestrator.chaos.campaign.run_campaign`): SQLite seeds 1..N and PostgreSQL seeds
101..100+M on a local multi-node cluster of ``--local-nodes`` worker nodes (so ``kill-node``
is in the draw), the PostgreSQL ones spread evenly among the SQLite ones (a run cut short still
has both), and prints one table: every campaign's line (steps, faults fired, breaches, final
reward against the fault-free run of its seed), then the faults by kind over all of them
(planned, planned into a recovery, fired, fired inside an earlier fault's recovery, recovered,
recovery p50/p99), then every breach with the fault it followed. The table so far is also
written to ``RUNS_DIR/table.txt`` after every campaign. Exit 1 if any campaign has a breach.

A campaign set can be split: ``--only 1-4,101-105`` runs only those seeds of the set (seeds
from 101 are the PostgreSQL ones), and every result is kept in ``RUNS_DIR/results/``, so
``--table-from`` prints one table over the results of several runs. Never run two PostgreSQL
campaigns at once: the database outage stops the one server they share.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

from _report import seed_list  # noqa: E402
from orchestrator.chaos.campaign import (  # noqa: E402
    CampaignOptions,
    CampaignResult,
    run_campaign,
)
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
    parser.add_argument("--only", type=seed_list, default=None,
                        help="run only these seeds of the set, e.g. 1-4,101-105")
    parser.add_argument("--table-from", type=Path, nargs="+", default=None,
                        help="print one table over the results kept in these runs dirs")
    args = parser.parse_args()
    if args.table_from:
        return print_table(load_results(args.table_from))
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
    results_dir = runs_dir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    for options in interleaved(sqlite, postgres):
        if args.only is not None and options.seed not in args.only:
            continue
        result = run_campaign(options)
        # The same code reads it back (--table-from): a bench artefact, not an interface.
        (results_dir / f"seed-{options.seed}.pkl").write_bytes(pickle.dumps(result))
        print(f"seed {options.seed} ({'postgresql' if options.db else 'sqlite'}): "
              f"{'pass' if result.ok else 'FAIL'}, {len(result.fired)} faults, "
              f"{len(result.verdict.breaches)} breaches, {result.wall_s:.0f} s", flush=True)
        table.add(result)
        with (runs_dir / "table.txt").open("w") as sink:
            table.print(sink)
    print(f"runs: {runs_dir}")
    return print_table(table.results)


def print_table(results: list[CampaignResult]) -> int:
    """Print the table of ``results``; the exit status (1 if any has a breach)."""
    table = ChaosTable()
    for result in results:
        table.add(result)
    table.print()
    return 0 if all(result.ok for result in results) else 1


def load_results(runs_dirs: list[Path]) -> list[CampaignResult]:
    """The campaign results kept in ``runs_dirs`` (their ``results/``), SQLite seeds first,
    each in seed order."""
    results = [pickle.loads(path.read_bytes())
               for runs_dir in runs_dirs for path in (runs_dir / "results").glob("seed-*.pkl")]
    return sorted(results, key=lambda result: (result.options.db is not None,
                                               result.options.seed))


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
