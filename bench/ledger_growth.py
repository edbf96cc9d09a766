"""Ledger growth: what a long run costs, at 1k, 10k and 100k steps, SQLite beside PostgreSQL.

    python bench/ledger_growth.py [--steps 1000 10000 100000] [--quick] [--pg-url URL]
                                  [--backends sqlite postgresql] [--repeat 3]

One ledger per size and backend, grown with steps shaped like the main job's (``_growth_run``:
``weight_update_started``, ``weight_committed``, ``engines_stamped`` for 8 engines,
``batch_trained`` with 256 prompts). All but the last 200 steps are written by the bulk path
(the same rows the locked append writes, in chunks; the full verify below checks every row),
with one read-model snapshot and audit checkpoint 1,000 steps before the end; the last 200
steps go through the public API one transaction per event, in rounds alternating the sizes,
and their p50 is the append figure.
So resume and ``prompts`` fold a 1,000-step tail, and ``verify --since-verified`` checks the
last 1,000 steps (the job stores a snapshot every 500 steps, so these are upper bounds).

Columns: events, DB size (SQLite: page count x page size; PostgreSQL: the tables' total
relation size) and bytes per step; one step's 4 appends (p50 of the last 200); resume
(``Ledger.progress``: snapshot + tail fold, prompt accounting included); and the CLI commands
as a user runs them (a new process each, start-up included, the package byte-compiled as an
install leaves it; median of ``--repeat``, commands alternated): status, lag, show V/2, lineage --step N/2, prompts, verify --since-verified, and
the full verify with its events/s. Ratios are to the 1k row of the same backend.

Prints tables; asserts nothing (a verify that finds problems is printed as such).
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from _growth_run import api_step, bulk_rows, start
from _report import machine_line, rotated
import ledger
from ledger import Ledger

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
RUN = "growth"
API_STEPS = 200
TAIL_STEPS = 1000
LEDGER_CLI = [sys.executable, "-c", "from ledger.cli import main; main()"]


def _sqlite(directory: Path, steps: int) -> tuple[str, object]:
    return f"sqlite:///{directory / f'growth-{steps}.db'}", None


def _postgres(base: str) -> tuple[str, object]:
    schema = f"growth_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options=-csearch_path%3D{schema}", (admin, schema)


def _drop(cleanup: object) -> None:
    if cleanup is None:
        return
    admin, schema = cleanup
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


def _size(url: str) -> int:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            pages = conn.execute(sa.text("PRAGMA page_count")).scalar()
            size = pages * conn.execute(sa.text("PRAGMA page_size")).scalar()
        else:
            size = conn.execute(sa.text(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
                "AND c.relkind = 'r'")).scalar()
    engine.dispose()
    return int(size)


def _cli(url: str, *args: str) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([*LEDGER_CLI, "--db", url, *args], capture_output=True,
                          env={**os.environ, "LEDGER_DB": ""}, check=False)
    return time.perf_counter() - started, done.returncode


def build(url: str, steps: int) -> float:
    """Grow one ledger to ``steps - API_STEPS`` (bulk), with the snapshot and checkpoint
    ``TAIL_STEPS`` before the end; returns the seconds it took."""
    began = time.perf_counter()
    with Ledger.open(url, snapshot_every=0) as ledger:
        epoch = start(ledger, RUN)
        checkpoint_at = steps - TAIL_STEPS
        if checkpoint_at > 0:
            bulk_rows(ledger, RUN, 1, checkpoint_at, epoch)
            ledger.checkpoint(RUN)  # a snapshot and an audit checkpoint (a full verify)
        bulk_rows(ledger, RUN, max(checkpoint_at, 0) + 1, steps - API_STEPS, epoch)
    _analyze(url)
    return time.perf_counter() - began


def _analyze(url: str) -> None:
    """PostgreSQL: refresh the planner's statistics. A run grown over days has been analyzed
    by autovacuum many times over; the bulk path writes it in seconds, and with no statistics
    the planner takes a 500-key lookup for a few rows and scans the run's whole index."""
    if not url.startswith("postgresql"):
        return
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
    engine.dispose()


def append_rounds(urls: dict[int, str], rounds: int = 8) -> dict[int, list[float]]:
    """The last ``API_STEPS`` steps of every ledger through the public API, in rounds that
    alternate the sizes (so load on the machine falls on all of them alike)."""
    ledgers = {steps: Ledger.open(url, snapshot_every=0) for steps, url in urls.items()}
    latencies: dict[int, list[float]] = {steps: [] for steps in urls}
    per_round = API_STEPS // rounds
    try:
        for round_index in range(rounds):
            for steps in rotated(list(urls), round_index):
                first = steps - API_STEPS + 1 + round_index * per_round
                for step in range(first, first + per_round):
                    began = time.perf_counter()
                    api_step(ledgers[steps], RUN, step, 1)
                    latencies[steps].append(time.perf_counter() - began)
    finally:
        for ledger in ledgers.values():
            ledger.close()
    return latencies


COMMANDS = {
    "status": lambda steps: ["status"], "lag": lambda steps: ["lag"],
    "show": lambda steps: ["show", str(steps // 2)],
    "lineage": lambda steps: ["lineage", "--step", str(steps // 2)],
    "prompts": lambda steps: ["prompts"],
    "verify_inc": lambda steps: ["verify", "--since-verified"],
    "verify": lambda steps: ["verify"],
}


def measure(urls: dict[int, str], repeat: int) -> list[dict[str, float]]:
    """Every column of every size (see the module docstring); CLI commands and sizes
    alternate round by round."""
    latencies = append_rounds(urls)
    rows = {}
    for steps, url in urls.items():
        with Ledger.open(url, readonly=True) as reader:
            began = time.perf_counter()
            progress = reader.progress(RUN)
            resume_s = time.perf_counter() - began
            assert progress.prompts.next_index == steps * 256
            began = time.perf_counter()
            report = reader.verify(RUN)
            verify_inproc_s = time.perf_counter() - began
            events = reader.head(RUN).seq
        rows[steps] = {
            "steps": steps, "events": events, "size": _size(url),
            "append_ms": 1000 * statistics.median(latencies[steps]),
            "resume_s": resume_s, "verify_ok": float(report.ok),
            "verify_inproc_eps": report.events_checked / verify_inproc_s,
        }
    times = {(steps, name): [] for steps in urls for name in COMMANDS}
    for round_index in range(repeat):
        for steps in rotated(list(urls), round_index):
            for name in rotated(list(COMMANDS), round_index):
                elapsed, code = _cli(urls[steps], *COMMANDS[name](steps))
                times[steps, name].append(elapsed)
                if name == "verify" and code != 0:
                    rows[steps]["verify_ok"] = 0.0
    for (steps, name), values in times.items():
        rows[steps][f"{name}_s"] = statistics.median(values)
    for row in rows.values():
        row["verify_eps"] = row["events"] / row["verify_s"]
    return [rows[steps] for steps in sorted(rows)]


def _print(backend: str, rows: list[dict[str, float]]) -> None:
    base = rows[0]
    print(f"\n{backend}")
    print("| steps | events | DB size | B/step | 4 appends p50 | resume | status | lag | show | "
          "lineage --step | prompts | verify --since-verified | verify (full) | "
          "full verify ev/s (CLI / in-process) |")
    print("|" + "---|" * 14)
    for row in rows:
        def cell(key: str, unit: str = "s", scale: float = 1.0, digits: int = 2) -> str:
            ratio = row[key] / base[key] if base[key] else float("nan")
            text = f"{row[key] * scale:.{digits}f} {unit}".strip()
            return text if row is base else f"{text} ({ratio:.2f}x)"
        print(f"| {int(row['steps']):,} | {int(row['events']):,} | {row['size'] / 1e6:.1f} MB | "
              f"{row['size'] / row['steps']:.0f} | {cell('append_ms', 'ms', digits=2)} | "
              f"{cell('resume_s')} | {cell('status_s')} | {cell('lag_s')} | {cell('show_s')} | "
              f"{cell('lineage_s')} | {cell('prompts_s')} | {cell('verify_inc_s')} | "
              f"{cell('verify_s')} | {row['verify_eps']:,.0f} / {row['verify_inproc_eps']:,.0f}"
              f"{'' if row['verify_ok'] else ' (PROBLEMS)'} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="1k and 5k steps")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--pg-url", default=os.environ.get("LEDGER_TEST_PG_URL", DEFAULT_PG_URL))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [1000, 5000] if args.quick else args.steps
    # The CLI as an installed package runs it: byte-compiled (pip compiles what it installs; an
    # editable install under PYTHONDONTWRITEBYTECODE would compile every module at every start).
    compileall.compile_dir(Path(ledger.__file__).parent, quiet=1)
    print(f"ledger growth: {machine_line()}; batch 256, 8 engines; CLI times include start-up")
    with tempfile.TemporaryDirectory(prefix="ledger-growth-") as tmp:
        for backend in args.backends:
            urls, cleanups = {}, []
            try:
                for steps in sizes:
                    url, cleanup = (_sqlite(Path(tmp), steps) if backend == "sqlite"
                                    else _postgres(args.pg_url))
                    cleanups.append(cleanup)
                    built = build(url, steps)
                    urls[steps] = url
                    print(f"  {backend} {steps:,} steps built in {built:.0f} s", file=sys.stderr,
                          flush=True)
                _print(backend, measure(urls, args.repeat))
            except sa.exc.OperationalError as exc:
                print(f"{backend}: unreachable ({str(exc).splitlines()[0]})")
            finally:
                for cleanup in cleanups:
                    _drop(cleanup)

if __name__ == "__main__":
    main()
