"""A multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), for drills and tests.

The head node runs only the driver (``num_cpus=0``, as on a real cluster's head); each worker
node gets ``cpus_per_node`` logical CPUs (actors take fractions of them, so a few suffice).
A node is removed through Ray (its raylet and workers are killed), never by a process id.

Node-death detection is Ray's GCS health check: a node is declared dead after
``health_check_failure_threshold`` missed checks, one every ``health_check_period_ms``, each
allowed ``health_check_timeout_ms``. Ray's defaults (3000 ms, 5, 10000 ms) keep a removed node
"alive" for about 15 s; the local cluster uses :data:`HEALTH_CHECK` (500 ms, 3, 1000 ms: about
1.5 s), which is what the kill-node drill and the multi-node tests measure recovery with. On a
real cluster set the same keys with ``ray start --head --system-config='{...}'``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

__all__ = ["HEALTH_CHECK", "LocalCluster"]

logger = logging.getLogger(__name__)

HEALTH_CHECK: dict[str, int] = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 1000,
    "health_check_initial_delay_ms": 1000,
}


class LocalCluster:
    """A head node plus ``worker_nodes`` worker nodes on this machine.

    Build it before Ray is initialised in this process, then :meth:`connect`.
    ``health_check``: the GCS settings (``{}`` for Ray's defaults; None: :data:`HEALTH_CHECK`).

    Raises:
        ValueError: fewer than one worker node.
        RuntimeError: Ray is already initialised in this process.
    """

    def __init__(self, worker_nodes: int, cpus_per_node: int = 2,
                 health_check: dict[str, int] | None = None) -> None:
        import ray
        from ray.cluster_utils import Cluster

        if worker_nodes < 1:
            raise ValueError("a local multi-node cluster needs at least one worker node")
        if ray.is_initialized():
            raise RuntimeError("Ray is already initialised in this process; build the local "
                               "cluster first")
        os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
        self.health_check = dict(HEALTH_CHECK if health_check is None else health_check)
        self.cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "_system_config": dict(self.health_check),
        })
        self.workers: list[Any] = [self.cluster.add_node(num_cpus=cpus_per_node)
                                   for _ in range(worker_nodes)]
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        """The GCS address (what ``--ray-address`` would be)."""
        return str(self.cluster.address)

    def connect(self) -> None:
        """Initialise Ray in this process as a driver on the head node."""
        import ray

        ray.init(address=self.address, log_to_driver=False, configure_logging=False)

    def worker_node_ids(self) -> list[str]:
        """The node ids of the worker nodes still in the cluster."""
        return [node.node_id for node in self.workers]

    def add_worker_node(self, cpus: int = 2) -> str:
        """Add a worker node (a new machine joining, as after a loss); returns its node id
        once the cluster lists it. Call it from the process's main thread: Ray installs a
        signal handler for every node it starts."""
        node = self.cluster.add_node(num_cpus=cpus)
        self.cluster.wait_for_nodes()
        self.workers.append(node)
        return str(node.node_id)

    def remove_node(self, node_id: str) -> float:
        """Remove worker node ``node_id``: kill its raylet and workers, as a machine that
        dies does. Returns at once (Ray has not noticed yet: see :meth:`wait_until_dead`)
        with the monotonic time of the removal.

        Raises:
            KeyError: not a worker node of this cluster.
        """
        node = next((n for n in self.workers if n.node_id == node_id), None)
        if node is None:
            raise KeyError(f"{node_id} is not a worker node of this cluster")
        removed_at = time.monotonic()
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        return removed_at

    @staticmethod
    def wait_until_dead(node_id: str, since: float, timeout_s: float = 120.0) -> float:
        """Wait until Ray lists ``node_id`` dead; returns the seconds since ``since`` (a
        monotonic time, e.g. :meth:`remove_node`'s).

        Raises:
            TimeoutError: still listed alive after ``timeout_s``.
        """
        import ray

        while time.monotonic() - since < timeout_s:
            alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
            if not alive.get(node_id, False):
                return time.monotonic() - since
            time.sleep(0.05)
        raise TimeoutError(f"node {node_id[:12]} still alive {timeout_s:g}s after removal")

    def shutdown(self) -> None:
        """Disconnect this process and stop every node."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()
