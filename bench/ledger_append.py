"""Ledger append: commits/s and latency, SQLite beside PostgreSQL, against the fsync floor.

    python bench/ledger_append.py [--commits 500] [--writers 1 4] [--pg-url URL] [--quick]

A weight update happens every few seconds in a real run, so the ledger is far from the
bottleneck; this measures how far, and what durability costs. Each commit is one transaction
(lock the head row, check fencing, chain the hash, insert, update the head), made durable
before it returns (SQLite: WAL with ``synchronous=FULL``; PostgreSQL: its WAL flush).

The fsync floor, measured in the same run on the same file system as the SQLite file: the
same bytes (each committed event's JSON) appended to a plain file with one ``fsync`` per
record, by as many writer processes as the ledger case. Nothing durable can append faster
than that; the ratio says what the ledger's transaction adds on top.

With 4 writers, 4 processes commit to the same run at once (the worst case: one head row, one
lock); commits/s counts all of them over the wall time from a common start.

Prints a table; asserts nothing (the audit at the end is checked and reported).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from _report import machine_line
from ledger import Ledger, LedgerError

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Measure:
    """Per-operation latencies of all writers, and the wall time of the whole batch."""

    latencies: list[float]
    wall_s: float

    @property
    def per_s(self) -> float:
        return len(self.latencies) / self.wall_s

    def percentile_ms(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[int(fraction * (len(ordered) - 1))]


def _commit_worker(url: str, run_id: str, epoch: int, first_step: int, commits: int,
                   barrier, results) -> None:
    with Ledger.open(url) as ledger:
        latencies = []
        barrier.wait()
        for step in range(first_step, first_step + commits):
            started = time.perf_counter()
            ledger.commit_weights(run_id, cell_id="cell-0", epoch=epoch, train_step=step)
            latencies.append(time.perf_counter() - started)
        results.put((latencies, time.perf_counter()))


def _fsync_worker(path: str, records: list[bytes], barrier, results) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        latencies = []
        barrier.wait()
        for record in records:
            started = time.perf_counter()
            os.write(fd, record)
            os.fsync(fd)
            latencies.append(time.perf_counter() - started)
        results.put((latencies, time.perf_counter()))
    finally:
        os.close(fd)


def _run_writers(target, per_writer_args: list[tuple]) -> Measure:
    """Start one process per argument tuple, release them together, gather their latencies."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(per_writer_args) + 1)
    results = context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results))
                 for args in per_writer_args]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    gathered = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    latencies = [latency for batch, _ in gathered for latency in batch]
    return Measure(latencies, max(finished for _, finished in gathered) - started)


def measure_ledger(url: str, commits: int,
                   writers: int) -> tuple[Measure, list[bytes], bool, float]:
    """``writers`` processes commit ``commits`` versions in all to one fresh run. Returns the
    measure, each committed event's JSON bytes (for the floor), the audit verdict and the
    verify rate (events/s)."""
    import json

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with Ledger.open(url) as ledger:
        ledger.start_run(run_id)
        epoch = ledger.promote(run_id, "cell-0")
    share = commits // writers
    measure = _run_writers(_commit_worker, [
        (url, run_id, epoch, index * share, share) for index in range(writers)
    ])
    with Ledger.open(url, readonly=True) as ledger:
        records = [(json.dumps(event.to_dict(), sort_keys=True) + "\n").encode()
                   for event in ledger.events(run_id) if event.kind == "weight_committed"]
        started = time.perf_counter()
        ok = ledger.verify(run_id).ok
        verify_rate = (len(records) + 2) / (time.perf_counter() - started)
    return measure, records, ok, verify_rate


def measure_floor(directory: Path, records: list[bytes], writers: int) -> Measure:
    """The same records appended with one fsync each, split across ``writers`` processes."""
    path = str(directory / f"floor-{uuid.uuid4().hex[:8]}.log")
    share = len(records) // writers
    return _run_writers(_fsync_worker, [
        (path, records[index * share:(index + 1) * share]) for index in range(writers)
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 commits")
    args = parser.parse_args()
    if args.quick:
        args.commits = 40

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        backends = [("SQLite (WAL, synchronous=FULL)", f"sqlite:///{directory}/b.db"),
                    ("PostgreSQL 127.0.0.1", args.pg_url)]
        for writers in args.writers:
            for name, url in backends:
                try:
                    ledger, records, ok, verify_rate = measure_ledger(url, args.commits, writers)
                except LedgerError as exc:
                    print(f"{name} skipped: {exc}")
                    continue
                floor = measure_floor(directory, records, writers)
                rows.append((name, writers, ledger, floor, ok, verify_rate))

    print(f"{machine_line()}; {args.commits} commits per case; floor = the same bytes "
          "appended to a plain file, one fsync per record, same writers")
    print("| backend | writers | commits/s | p50 ms | p99 ms | floor rec/s | floor p50 ms | "
          "floor p99 ms | p50 / floor | p99 / floor | floor rate / commits/s | verify ev/s "
          "| audit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, writers, ledger, floor, ok, verify_rate in rows:
        print(f"| {name} | {writers} | {ledger.per_s:.0f} | {ledger.percentile_ms(0.5):.2f} | "
              f"{ledger.percentile_ms(0.99):.2f} | {floor.per_s:.0f} | "
              f"{floor.percentile_ms(0.5):.2f} | {floor.percentile_ms(0.99):.2f} | "
              f"{ledger.percentile_ms(0.5) / floor.percentile_ms(0.5):.1f} | "
              f"{ledger.percentile_ms(0.99) / floor.percentile_ms(0.99):.1f} | "
              f"{floor.per_s / ledger.per_s:.1f} | {verify_rate:.0f} | "
              f"{'clean' if ok else 'PROBLEMS'} |")
    if any(row[1] > 1 for row in rows):
        print("(writers > 1: latencies include waiting for the run's head-row lock)")


if __name__ == "__main__":
    main()
