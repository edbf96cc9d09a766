"""A campaign's job in a process of its own (``python -m orchestrator.chaos.job_process SPEC``).

The campaign runner starts the job here so that a fault may kill the job's driver (and its
workers) and the runner can resume the run in a fresh process, as the crash drills do
(:mod:`orchestrator.drills.crash`). The spec file (JSON, written by
:func:`write_spec`) holds the run's config, whether to resume, the schedule and the seed; the
hooks are :class:`~orchestrator.chaos.injection.ChaosHooks`, told which faults the ledger already
records as fired. With ``local_nodes`` the job runs on a local multi-node cluster built here.

Exit codes: 0 the run finished; 1 it failed (``run_failed`` recorded); -9 (SIGKILL) a fault
killed it; anything else is a bug the runner reports.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JobSpec", "main", "write_spec"]


@dataclass(frozen=True)
class JobSpec:
    """What one job process runs: ``config`` (RunConfig fields), resume or not, the schedule
    (:meth:`PlannedFault.to_payload` items; empty for a fault-free baseline)."""

    config: dict[str, Any]
    runs_dir: str
    resume: bool
    schedule: list[dict[str, Any]]
    seed: int
    local_nodes: int = 0


def write_spec(path: Path, spec: JobSpec) -> Path:
    """Write ``spec`` to ``path`` (JSON) and return the path."""
    path.write_text(json.dumps(spec.__dict__))
    return path


def main(spec_path: str) -> int:
    """Run the job of the spec at ``spec_path``; returns the exit code (see module doc)."""
    from ledger import Ledger
    from orchestrator.chaos.injection import ChaosHooks, fired_indices
    from orchestrator.chaos.nemesis import schedule_from_payload
    from orchestrator.config import RunConfig
    from orchestrator.control.driver import JobOptions, run_job
    from orchestrator.errors import OrchestratorError

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    spec = JobSpec(**json.loads(Path(spec_path).read_text()))
    config = RunConfig(**spec.config)
    assert config.run_id is not None and config.db is not None
    cluster = None
    if spec.local_nodes:
        from orchestrator.control.placement.local import LocalCluster

        cluster = LocalCluster(spec.local_nodes)
        cluster.connect()
    ledger = Ledger.open(config.db)
    hooks = ChaosHooks(schedule_from_payload(spec.schedule),
                       fired_indices(ledger, config.run_id), seed=spec.seed, ledger=ledger,
                       ledger_url=config.db, cluster=cluster)
    options = JobOptions(resume=spec.resume, runs_dir=Path(spec.runs_dir), progress=False,
                         plot=False, hooks=hooks,
                         ray_address=cluster.address if cluster is not None else None)
    try:
        result = run_job(config, options)
        return 0 if result.ok else 1
    except OrchestratorError as exc:
        print(f"chaos job: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        hooks.join()
        ledger.close()
        if cluster is not None:
            cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
