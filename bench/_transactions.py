"""Ledger transactions per publishing step of a real job, counted in every process.

Not a benchmark itself; ``bench/weight_update.py`` prints its figure. A SQLAlchemy ``begin``
listener on the ``Engine`` class counts every transaction a process opens on any engine (the
ledger's, in the driver, the cells and the rollout manager: the real engines, not a model of
them). Ray's ``worker_process_setup_hook`` installs it in every worker process; each process
appends one timestamp per transaction to its own file. A short job publishes at every step, and
its ``on_step`` hook marks each step's end, so a step's transactions are those stamped between
the previous step's end and its own.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["LOG_DIR_ENV", "count_transactions", "install_listener"]

LOG_DIR_ENV = "BENCH_LEDGER_TX_LOG"


def install_listener() -> None:
    """Stamp every transaction this process begins into ``$BENCH_LEDGER_TX_LOG/<pid>.log``."""
    import sqlalchemy
    from sqlalchemy import event

    directory = os.environ.get(LOG_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"{os.getpid()}.log"

    def stamp(_connection) -> None:
        with path.open("a", encoding="utf-8") as sink:
            sink.write(f"{time.time():.6f}\n")

    event.listen(sqlalchemy.engine.Engine, "begin", stamp)


def count_transactions(steps: int = 6) -> dict[str, float]:
    """Run a ``steps``-step job that publishes every step (no checkpoint, no evaluation) on a
    fresh Ray cluster with the listener everywhere; returns the median, min and max number of
    ledger transactions per publishing step over steps 2..``steps`` (step 1 holds the start),
    and how many of the median step's came from the driver process.
    """
    import ray
    from ray import cloudpickle

    from orchestrator.config import RunConfig
    from orchestrator.control.driver import JobOptions, run_job

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "tx"
        log_dir.mkdir()
        os.environ[LOG_DIR_ENV] = str(log_dir)
        # Workers cannot import this script's directory: ship the hook by value.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {LOG_DIR_ENV: str(log_dir)},
                              "worker_process_setup_hook": install_listener})
        install_listener()  # the driver
        ends: list[float] = []
        config = RunConfig(run_id="tx-count", num_rollout=steps, update_weights_interval=1,
                           save_interval=10 * steps)
        try:
            run_job(config, JobOptions(runs_dir=Path(tmp) / "runs", progress=False, plot=False,
                                       on_step=lambda job, step: ends.append(time.time())))
        finally:
            ray.shutdown()
            os.environ.pop(LOG_DIR_ENV, None)
        stamps = {int(p.stem): [float(line) for line in p.read_text().split()]
                  for p in log_dir.glob("*.log")}
    per_step = []
    for before, end in zip(ends, ends[1:]):
        counts = {pid: sum(before < t <= end for t in times) for pid, times in stamps.items()}
        per_step.append((sum(counts.values()), counts.get(os.getpid(), 0)))
    totals = [total for total, _ in per_step]
    median = statistics.median(totals)
    driver = statistics.median(d for _, d in per_step)
    return {"median": median, "min": min(totals), "max": max(totals), "driver": driver,
            "steps": len(per_step)}
