"""A short run on a local multi-node Ray cluster, in its own process (tests/e2e/test_multinode.py).

``python -m tests.multinode_job LEDGER_URL RUNS_DIR [--workers N] [--remove-after STEP]``:

1. builds a head node (driver only) plus N worker nodes with ``ray.cluster_utils.Cluster``
   (:class:`orchestrator.control.placement.local.LocalCluster`, fast node-death detection);
2. checks the ledger URL refusals up front: a SQLite URL (in process and through the
   ``orchestrator run --ray-address`` CLI: one line, exit 2) and an unreachable PostgreSQL URL;
3. runs a job on ``LEDGER_URL`` and, after step ``--remove-after``, removes the worker node
   that holds the publisher cell (through Ray: the node's raylet and workers are killed);
4. prints one JSON line for the test: the run, the removed node, the checks' messages, and the
   removal time (naive UTC, like the ledger's ``recorded_at``).

A separate process because a ``Cluster`` cannot share a process with the test session's own
local Ray cluster (one Ray connection per process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.control.placement.local import LocalCluster
from orchestrator.control.driver import JobOptions, run_job
from orchestrator.errors import StartupError
from orchestrator.control.hooks import JobHooks

ROOT = Path(__file__).resolve().parents[1]


class RemovePublisherNode(JobHooks):
    """After step ``step``, remove the worker node holding the publisher cell."""

    def __init__(self, cluster: LocalCluster, step: int) -> None:
        self.cluster = cluster
        self.step = step
        self.fired: dict[str, Any] = {}
        self.watcher: threading.Thread | None = None

    def on_step_end(self, job: Any, step: int) -> None:
        if step != self.step or self.fired:
            return
        head = job.ledger.head(job.run_id)
        nodes = job.supervisor.placement.nodes()
        node = nodes[head.publisher_cell]
        removed_at = datetime.now(UTC).replace(tzinfo=None)
        since = self.cluster.remove_node(node.node_id)  # the job goes on before Ray notices
        self.fired = {
            "step": step, "publisher_cell": head.publisher_cell, "version_before": head.version,
            "seq_before": head.seq, "node_id": node.node_id, "host": node.host,
            "actors_on_node": sorted(a for a, n in nodes.items() if n.node_id == node.node_id),
            "removed_at": removed_at.isoformat(),
        }
        self.watcher = threading.Thread(target=self._watch, args=(node.node_id, since),
                                        daemon=True)
        self.watcher.start()

    def _watch(self, node_id: str, since: float) -> None:
        self.fired["ray_detect_s"] = round(self.cluster.wait_until_dead(node_id, since), 3)


def _refusals(cluster: LocalCluster, runs_dir: Path, config: RunConfig) -> dict[str, Any]:
    """What the URL checks say, before any job writes anything."""
    found: dict[str, Any] = {}
    for name, url in {"sqlite": f"sqlite:///{runs_dir}/refused.db",
                      "unreachable": "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"}.items():
        try:
            run_job(config.model_copy(update={"run_id": f"refused-{name}", "db": url}),
                    JobOptions(runs_dir=runs_dir, progress=False, plot=False))
            found[name] = "accepted"
        except StartupError as exc:
            found[name] = str(exc)
    found["sqlite_file_created"] = (runs_dir / "refused.db").exists()
    command = [sys.executable, "-c", "from orchestrator.cli import main; main()", "run",
               "--ray-address",
               cluster.address, "--runs-dir", str(runs_dir), "--run-id", "refused-cli",
               "--num-rollout", "1", "--no-progress"]
    cli = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    found["cli"] = {"exit": cli.returncode, "last_line": cli.stderr.strip().splitlines()[-1],
                    "traceback": "Traceback" in cli.stderr}
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger_url")
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--remove-after", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--ray-default-health-check", action="store_true",
                        help="Ray's own node-death detection (about 15 s) instead of 1.5 s")
    args = parser.parse_args()
    started = time.monotonic()
    cluster = LocalCluster(worker_nodes=args.workers, cpus_per_node=2,
                           health_check={} if args.ray_default_health_check else None)
    try:
        cluster.connect()
        config = RunConfig(
            run_id=f"multinode-{datetime.now(UTC):%H%M%S}", db=args.ledger_url,
            rollout_batch_size=4, n_samples_per_prompt=4, async_max_concurrent_samples=4,
            num_rollout=args.steps, save_interval=2, heartbeat_timeout_s=3.0,
        )
        refusals = _refusals(cluster, args.runs_dir, config)
        hook = RemovePublisherNode(cluster, args.remove_after)
        result = run_job(config, JobOptions(runs_dir=args.runs_dir, progress=False,
                                            plot=False, hooks=hook))
        if hook.watcher is not None:
            hook.watcher.join(timeout=120)
        print(json.dumps({
            "run_id": result.run_id, "ok": result.ok, "steps": result.steps,
            "negative_staleness_total": result.negative_staleness_total,
            "audit_problems": result.audit_problems, "removed": hook.fired,
            "refusals": refusals, "health_check": cluster.health_check,
            "wall_s": round(time.monotonic() - started, 1),
        }), flush=True)
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
