"""Ledger append throughput: commits/s and latency percentiles, SQLite beside PostgreSQL.

    python bench/ledger_append.py [--commits 500] [--pg-url URL]

A weight update happens every few seconds in a real run, so the ledger is far from the
bottleneck; this measures how far, and what durability (synchronous=FULL, one fsync per commit
on SQLite) costs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

from ledger import Ledger, LedgerError

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def measure(url: str, commits: int) -> dict[str, float]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with Ledger.open(url) as ledger:
        ledger.start_run(run_id)
        epoch = ledger.promote(run_id, "cell-0")
        latencies = []
        started = time.perf_counter()
        for step in range(commits):
            t0 = time.perf_counter()
            ledger.commit_weights(run_id, cell_id="cell-0", epoch=epoch, train_step=step)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        verify_started = time.perf_counter()
        assert ledger.verify(run_id).ok
        verify_s = time.perf_counter() - verify_started
    latencies.sort()
    return {
        "commits_per_s": commits / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "verify_events_per_s": (commits + 2) / verify_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("sqlite (WAL, synchronous=FULL)", measure(f"sqlite:///{tmp}/b.db", args.commits)))
    try:
        rows.append(("postgresql", measure(args.pg_url, args.commits)))
    except LedgerError as exc:
        print(f"postgresql skipped: {exc}")

    print(f"{'backend':32} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'verify ev/s':>12}")
    for name, row in rows:
        print(
            f"{name:32} {row['commits_per_s']:10.0f} {row['p50_ms']:8.2f} "
            f"{row['p99_ms']:8.2f} {row['verify_events_per_s']:12.0f}"
        )
    if len(rows) == 2:
        ratio = rows[0][1]["commits_per_s"] / rows[1][1]["commits_per_s"]
        print(f"sqlite/postgresql commit throughput ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
