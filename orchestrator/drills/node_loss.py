"""``kill-node``: a whole worker node lost mid-run, on a local multi-node cluster.

The drill runs on a cluster built with ``--local-nodes N``
(:class:`orchestrator.control.placement.local.LocalCluster`: a driver-only head plus N worker
nodes, fast node-death detection). After the planned step the worker node holding the
publisher cell (and whatever else the placement put there: with two worker nodes an engine,
with three or more perhaps none) is removed **through Ray**: ``ray.cluster_utils.Cluster.remove_node`` kills that node's raylet and workers. No
process id is signalled, so the fault means the same thing whichever machine the driver is on.

What recovery must show, on top of the generic checker (``verify()`` clean, no negative
staleness, no prompt lost, the run finished): a successor promoted; the next version is the
head at the fault + 1; the publisher cell healed onto a live node; each engine that was on the
removed node replaced; every engine at the head version, none on the removed node.

``kill-node`` is not part of ``--scenario all`` (whose drills run on any cluster): name it, with
``--local-nodes 2`` (or more) and a PostgreSQL ``--db``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import ray

from ledger import EventKind
from orchestrator.control.supervision.cell_group import CellState
from orchestrator.drills.checker import DrillRunState, first_commit_after
from orchestrator.drills.context import DrillContext, DrillError, DrillPoint
from orchestrator.drills.scenarios import Scenario

if TYPE_CHECKING:
    from orchestrator.control.driver import TrainingJob

__all__ = ["NODE_SCENARIOS", "remove_publisher_node"]

MIN_WORKER_NODES = 2  # the publisher's node goes; the survivors need somewhere to run


def remove_publisher_node(ctx: DrillContext, job: TrainingJob) -> None:
    """Remove the worker node holding the publisher cell, through Ray, and return at once;
    the fault is dated at the removal (recovery is measured from it) and recorded, with the
    node, the actors placed on it and how long Ray took to report it dead, once Ray has.

    Raises:
        DrillError: the drill has no local cluster to remove a node from, or the publisher
            runs on the driver's (head) node.
    """
    cluster = ctx.cluster
    if cluster is None:
        raise DrillError("kill-node removes a node: run it with --local-nodes 2 (or more)")
    head = job.ledger.head(job.run_id)
    placed = job.supervisor.placement.nodes()
    node = placed[head.publisher_cell]
    if node.node_id not in cluster.worker_node_ids():
        raise DrillError(f"the publisher {head.publisher_cell} runs on the head node, which "
                         "the drill cannot remove")
    on_node = sorted(actor for actor, where in placed.items() if where.node_id == node.node_id)
    ctx.record.mark_fired(head, cell=head.publisher_cell, epoch=head.epoch,
                          node_id=node.node_id, host=node.host, actors_on_node=on_node,
                          health_check=dict(cluster.health_check))
    since = cluster.remove_node(node.node_id)

    def record_when_dead() -> None:
        # The job goes on meanwhile: it must cope before Ray has noticed, as on a real loss.
        try:
            detect_s = cluster.wait_until_dead(node.node_id, since)
            ctx.record.detail["ray_detect_s"] = round(detect_s, 3)
        finally:
            ctx.record_fault_event()

    ctx.background(threading.Thread(target=record_when_dead, name="drill-node-death",
                                    daemon=True))


def _expect_node_recovered(ctx: DrillContext, job: TrainingJob | None,
                           state: DrillRunState) -> list[str]:
    detail = ctx.record.detail
    removed, cell = detail.get("node_id"), detail.get("cell")
    problems = []
    if state.promotions_since(ctx.record.seq_at_fault) < 1:
        problems.append("no successor was promoted after the node was removed")
    commit = first_commit_after(state, ctx.record.seq_at_fault)
    if commit is not None and commit.version != ctx.record.version_before + 1:
        problems.append(f"first version after the node loss is v{commit.version}, expected "
                        f"v{ctx.record.version_before + 1}")
    healed = [e for e in ctx.ledger.events(ctx.run_id, start_seq=ctx.record.seq_at_fault + 1)
              if e.kind == EventKind.CELL_STATE and e.payload.get("state") == CellState.HEALED
              and e.cell_id == cell]
    if not healed:
        problems.append(f"cell {cell} was never healed")
    elif healed[0].payload.get("node_id") in (None, removed):
        problems.append(f"cell {cell} was healed onto {healed[0].payload.get('node_id')}, "
                        "not a live node")
    if job is not None:
        problems += _expect_engines_replaced(job, state, removed,
                                             detail.get("actors_on_node", []))
    return problems


def _expect_engines_replaced(job: TrainingJob, state: DrillRunState, removed: str | None,
                             on_node: list[str]) -> list[str]:
    """Every engine at the head version on a live node, and as many engine restarts as there
    were engines on the removed node: what the placement put there is what must be replaced
    (with two worker nodes an engine shares the publisher's node; with three it may not)."""
    problems = []
    lost = [actor for actor in on_node if actor.startswith("engine-")]
    restarts = job.supervisor.counters.engine_restarts
    if restarts < len(lost):
        problems.append(f"{restarts} engine restarts, but engines {lost} were on the removed "
                        "node")
    engines = job.supervisor.engines
    health: list[dict[str, Any]] = ray.get([e.health.remote() for e in engines.values()],
                                           timeout=60)
    versions = {engine_id: h["version"] for engine_id, h in zip(engines, health)}
    if any(version != state.head_version for version in versions.values()):
        problems.append(f"engines at versions {versions} at the end, head is "
                        f"v{state.head_version}")
    placed = job.supervisor.placement.nodes()
    stranded = [e for e in engines if e in placed and placed[e].node_id == removed]
    if stranded:
        problems.append(f"engines {stranded} are still placed on the removed node")
    return problems


NODE_SCENARIOS: dict[str, Scenario] = {
    "kill-node": Scenario("kill-node", (DrillPoint.BETWEEN_STEPS,), (1, 2, 3),
                          remove_publisher_node,
                          _expect_node_recovered),
}
