"""The cluster's nodes as the control plane sees them: alive ones, the driver's, an actor's.

Ray's view of a node (``ray.nodes()``) lags a node's death by its health check (period x
failure threshold, about 15 s with Ray's defaults). A node where one of our actors was just
lost may therefore still be listed alive: :func:`probe_node` asks it to run a task, and a node
that does not answer within the timeout is treated as gone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.cluster.node_info import node_and_host

__all__ = ["NodeInfo", "actor_node", "live_nodes", "probe_node", "this_node"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node: its id, its address, its logical CPUs and GPUs."""

    node_id: str
    host: str
    cpus: float = 0.0
    gpus: float = 0.0

    def fields(self) -> dict[str, str]:
        """What the ledger's events record of the node."""
        return {"node_id": self.node_id, "host": self.host}


def live_nodes() -> list[NodeInfo]:
    """Nodes Ray reports alive, in node id order (includes a node dying unnoticed)."""
    nodes = [
        NodeInfo(node["NodeID"], node["NodeManagerAddress"],
                 float(node.get("Resources", {}).get("CPU", 0.0)),
                 float(node.get("Resources", {}).get("GPU", 0.0)))
        for node in ray.nodes() if node.get("Alive")
    ]
    return sorted(nodes, key=lambda node: node.node_id)


def this_node() -> NodeInfo:
    """The node of the calling process (the driver's, in the control plane)."""
    node_id, host = node_and_host()
    for node in live_nodes():
        if node.node_id == node_id:
            return node
    return NodeInfo(node_id, host)


def _where(actor_self: Any) -> tuple[str, str]:
    return node_and_host()


def actor_node(actor: Any, timeout_s: float) -> NodeInfo:
    """The node ``actor`` runs on; waits until it has started (at most ``timeout_s``).

    Raises:
        ray.exceptions.RayActorError: the actor died (also before it ran: its node died).
        ray.exceptions.GetTimeoutError: it did not start within ``timeout_s``.
    """
    node_id, host = ray.get(actor.__ray_call__.remote(_where), timeout=timeout_s)
    return NodeInfo(node_id, host)


@ray.remote(num_cpus=0, max_retries=0)
def _node_id() -> str:
    return node_and_host()[0]


def probe_node(node_id: str, timeout_s: float) -> bool:
    """Whether ``node_id`` runs a task within ``timeout_s`` (False for a dead or dying node)."""
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    ref = _node_id.options(scheduling_strategy=strategy).remote()
    try:
        return ray.get(ref, timeout=timeout_s) == node_id
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable now"
        logger.info("node %s did not answer a probe: %s", node_id[:12], type(exc).__name__)
        ray.cancel(ref, force=True)
        return False
