"""Placement: which node each cell and engine of a run goes to, first and after a loss.

**At start** each role (cells, engines) gets one placement group with a bundle per actor
(``{"CPU": cpus}``, plus ``"GPU": gpus`` when the role asks for GPUs:
:func:`~orchestrator.control.launch.role_resources`). With ``placement="spread"`` the group is ``STRICT_SPREAD`` when the
cluster has at least as many nodes with room as the role has actors (every cell on its own
node: losing a node loses one cell), else ``SPREAD`` with a warning (best effort; on a
one-node cluster there is nothing to spread over, so that is only logged). ``placement="pack"``
uses ``PACK``. The actor with the i-th id of its role runs in bundle i.

**A replacement** (a healed cell, a restarted engine) is placed only on a live node:

- the node of the actor it replaces is *suspect*: Ray may still list it alive for a health
  check's length after it died. Other live nodes are preferred; a suspect node is used again
  only when that matters (nowhere else, or only nodes that already hold the role) and after it
  answered a probe within ``heartbeat_timeout_s`` (:func:`~.nodes.probe_node`);
- the actor's own bundle is reused when its node is live and trusted (Ray may have moved the
  bundle already); otherwise the actor gets hard node affinity to the chosen node: ``spread``
  picks the node holding the fewest actors of the role, ``pack`` the one holding the most;
- the new actor must start (answer a call) within ``actor_start_timeout_s``. One that "died
  before it ran" (its node died meanwhile) or never started is killed and placed again on
  another node, at most ``max_attempts`` times: then
  :class:`~orchestrator.errors.SupervisionLimitError` ends the run.

Every decision is remembered (:meth:`Placement.node_fields`), so the ledger's events can say
which node an actor runs on.
"""

from __future__ import annotations

import logging
import secrets
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from actors.cluster.node_info import this_node_id
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.placement.nodes import NodeInfo, actor_node, live_nodes, probe_node
from orchestrator.errors import StartupError, SupervisionLimitError

if TYPE_CHECKING:
    from orchestrator.control.supervision.failure_policy import FailurePolicy

__all__ = ["ActorFactory", "Placement", "group_strategy", "start_on_a_live_node"]

logger = logging.getLogger(__name__)

ActorFactory = Callable[[RunConfig, str], Any]
_ROLE_COUNT = {"cell": "num_cells", "engine": "num_engines"}  # RunConfig field per role


def group_strategy(mode: str, nodes_with_room: int, actors: int) -> str:
    """The placement-group strategy for ``actors`` bundles on a cluster with
    ``nodes_with_room`` nodes big enough for one (see the module docstring)."""
    if mode == "pack":
        return "PACK"
    return "STRICT_SPREAD" if nodes_with_room >= actors else "SPREAD"


@dataclass
class _Role:
    """One role's placement group and which bundle each actor id holds."""

    name: str
    cpus: float
    group: PlacementGroup
    bundles: dict[str, int] = field(default_factory=dict)
    gpus: float = 0.0

    def fits(self, node: NodeInfo) -> bool:
        """Whether ``node`` is big enough for one actor of the role."""
        return node.cpus >= self.cpus and node.gpus >= self.gpus

    def bundle_of(self, actor_id: str) -> int:
        return self.bundles.setdefault(actor_id, len(self.bundles))


class Placement:
    """The placement of one run's cells and engines. Not thread-safe (the driver's thread).

    Args:
        config: the run's config (``placement``, ``num_cells``, ``num_engines``, ``run_id``).
        policy: the limits (``actor_start_timeout_s``, ``heartbeat_timeout_s``,
            ``max_attempts``).
    """

    def __init__(self, config: RunConfig, policy: FailurePolicy) -> None:
        self.mode = config.placement
        self.run_id = config.run_id or "run"
        self.policy = policy
        self._resources = {role: launch.role_resources(config, role) for role in _ROLE_COUNT}
        self._roles: dict[str, _Role] = {}
        self._nodes: dict[str, NodeInfo] = {}  # actor id -> the node it was placed on
        self._role_of: dict[str, str] = {}
        self._suspect: set[str] = set()  # node ids where an actor of ours was lost
        # A placement dropped without release() (a test that stops only its cells) must not
        # keep its CPUs reserved in a long-lived cluster.
        self._groups: list[PlacementGroup] = []
        weakref.finalize(self, _remove_groups, self._groups)

    # ------------------------------------------------------------------ the factories

    def placed(self, factory: ActorFactory, role: str) -> ActorFactory:
        """``factory`` with placement: the first actor of an id goes to its bundle, a second
        one (a replacement) to a live node, started and retried as the module docstring says.

        The returned factory raises :class:`StartupError` if the role's placement group cannot
        be reserved, :class:`SupervisionLimitError` if a replacement cannot be started on any
        node within ``max_attempts``.
        """
        if role not in _ROLE_COUNT:
            raise ValueError(f"unknown role {role!r}; expected one of {sorted(_ROLE_COUNT)}")

        def create(config: RunConfig, actor_id: str) -> Any:
            return self._create(factory, role, config, actor_id)

        return create

    def node_fields(self, actor_id: str) -> dict[str, str]:
        """``{"node_id", "host"}`` of the node ``actor_id`` was placed on (``{}`` if unknown)."""
        node = self._nodes.get(actor_id)
        return node.fields() if node is not None else {}

    def nodes(self) -> dict[str, NodeInfo]:
        """Actor id -> the node it was (last) placed on."""
        return dict(self._nodes)

    def release(self) -> None:
        """Remove the run's placement groups (best effort; safe to call twice)."""
        _remove_groups(self._groups)
        self._roles.clear()

    # ------------------------------------------------------------------ first placement

    def _role(self, role: str, config: RunConfig) -> _Role:
        if role not in self._roles:
            self._roles[role] = self._reserve(role, int(getattr(config, _ROLE_COUNT[role])))
        return self._roles[role]

    def _reserve(self, role: str, count: int) -> _Role:
        bundle = self._resources[role]
        cpus, gpus = bundle["CPU"], bundle.get("GPU", 0.0)
        nodes = live_nodes()
        with_room = [node for node in nodes if node.cpus >= cpus and node.gpus >= gpus]
        strategy = group_strategy(self.mode, len(with_room), count)
        if self.mode == "spread" and strategy == "SPREAD":
            level = logging.WARNING if len(nodes) > 1 else logging.INFO
            logger.log(level, "placement: %d %ss but %d nodes with room: SPREAD (two %ss may "
                       "share a node, and be lost together)", count, role, len(with_room), role)
        group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy,
                                name=f"{self.run_id}-{role}s-{secrets.token_hex(3)}")
        self._groups.append(group)
        if not group.wait(timeout_seconds=self.policy.actor_start_timeout_s):
            remove_placement_group(group)
            raise StartupError(
                f"cannot place {count} {role}s ({strategy}, {cpus:g} CPU and {gpus:g} GPU "
                f"each) on the cluster's {len(nodes)} nodes within "
                f"{self.policy.actor_start_timeout_s:g}s"
            )
        logger.info("placement: %d %ss, %s, bundle %s", count, role, strategy, bundle)
        return _Role(role, cpus, group, gpus=gpus)

    def _bundle_node(self, role: _Role, index: int) -> NodeInfo | None:
        node_id = placement_group_table(role.group).get("bundles_to_node_id", {}).get(index)
        hosts = {node.node_id: node for node in live_nodes()}
        if node_id is None or node_id not in hosts:
            return None
        return hosts[node_id]

    # ------------------------------------------------------------------ creation

    def _create(self, factory: ActorFactory, role_name: str, config: RunConfig,
                actor_id: str) -> Any:
        role = self._role(role_name, config)
        previous = self._nodes.get(actor_id)
        self._role_of[actor_id] = role_name
        if previous is None:  # first placement: its bundle; the caller waits for it
            index = role.bundle_of(actor_id)
            strategy = PlacementGroupSchedulingStrategy(role.group, index)
            with launch.scheduled(strategy):
                actor = factory(config, actor_id)
            node = self._bundle_node(role, index)
            if node is not None:
                self._nodes[actor_id] = node
            return actor
        self._suspect.add(previous.node_id)
        return self._replace(factory, role, config, actor_id)

    def _replace(self, factory: ActorFactory, role: _Role, config: RunConfig,
                 actor_id: str) -> Any:
        tried: set[str] = set()
        failures: list[str] = []
        for _ in range(self.policy.max_attempts):
            choice = self._choose(role, actor_id, tried)
            if choice is None:
                failures.append("no live node with room")
                time.sleep(min(self.policy.heartbeat_timeout_s, 5.0))  # let Ray see deaths
                continue
            strategy, node = choice
            with launch.scheduled(strategy):
                actor = factory(config, actor_id)
            try:
                started_on = actor_node(actor, self.policy.actor_start_timeout_s)
            except (RayActorError, GetTimeoutError) as exc:
                reason = "did not start in time" if isinstance(exc, GetTimeoutError) else (
                    "died before it ran")
                logger.warning("%s %s on node %s (%s); placing it on another node", actor_id,
                               reason, node.node_id[:12], node.host)
                failures.append(f"{reason} on {node.host} ({node.node_id[:12]})")
                tried.add(node.node_id)
                self._suspect.add(node.node_id)
                _kill(actor)
                continue
            self._nodes[actor_id] = NodeInfo(started_on.node_id, started_on.host, node.cpus,
                                             node.gpus)
            logger.info("placement: %s replaced on node %s (%s)", actor_id,
                        started_on.node_id[:12], started_on.host)
            return actor
        raise SupervisionLimitError(
            f"{actor_id} could not be placed in {self.policy.max_attempts} attempts: "
            + "; ".join(failures))

    def _choose(self, role: _Role, actor_id: str, tried: set[str]) -> tuple[Any, NodeInfo] | None:
        """A scheduling strategy and the live node it targets, or None if there is none."""
        candidates = [node for node in live_nodes()
                      if role.fits(node) and node.node_id not in tried]
        alive = {node.node_id for node in candidates}
        self._suspect &= alive | tried  # a node Ray reports dead is simply gone
        trusted = [node for node in candidates if node.node_id not in self._suspect]
        best = self._best(role, trusted, actor_id)
        suspects = [node for node in candidates if node.node_id in self._suspect]
        if suspects and (best is None or self._load(best, role.name, actor_id) > 0):
            if len(live_nodes()) == 1:  # nowhere else to go: a wrong guess is retried
                trusted += suspects
            else:
                for node in suspects:
                    if probe_node(node.node_id, self.policy.heartbeat_timeout_s):
                        self._suspect.discard(node.node_id)
                        trusted.append(node)
            best = self._best(role, trusted, actor_id)
        if best is None:
            return None
        index = role.bundle_of(actor_id)
        bundle_node = self._bundle_node(role, index)
        if bundle_node is not None and bundle_node.node_id == best.node_id:
            return PlacementGroupSchedulingStrategy(role.group, index), best
        return NodeAffinitySchedulingStrategy(best.node_id, soft=False), best

    def _load(self, node: NodeInfo, role: str, excluding: str) -> int:
        """Actors of ``role`` (other than ``excluding``) placed on ``node``."""
        return sum(1 for actor_id, placed in self._nodes.items()
                   if placed.node_id == node.node_id and actor_id != excluding
                   and self._role_of.get(actor_id) == role)

    def _best(self, role: _Role, nodes: list[NodeInfo], actor_id: str) -> NodeInfo | None:
        if not nodes:
            return None

        def total(node: NodeInfo) -> int:
            return sum(1 for placed in self._nodes.values() if placed.node_id == node.node_id)

        if self.mode == "pack":
            return max(nodes, key=lambda node: (total(node), node.node_id))
        return min(nodes, key=lambda node: (self._load(node, role.name, actor_id), total(node),
                                            node.node_id))


def _remove_groups(groups: list[PlacementGroup]) -> None:
    """Remove ``groups`` (best effort: gone already, or Ray is shutting down) and forget them."""
    while groups:
        group = groups.pop()
        try:
            if ray.is_initialized():
                remove_placement_group(group)
        except Exception:  # noqa: BLE001
            logger.debug("could not remove a placement group", exc_info=True)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - it may never have existed anywhere
        pass


def start_on_a_live_node(create: Callable[[Any], Any], cpus: float, policy: FailurePolicy) -> Any:
    """Start a replacement actor with ``create(scheduling_strategy)`` on a node that is alive
    now, and wait until it runs; returns it.

    Ray may list a node alive for a health check's length after it died, and an actor it
    schedules there is cancelled before it runs. So each candidate (the caller's node first,
    then the other live nodes with ``cpus``, in id order) must answer a probe within
    ``node_probe_timeout_s`` before the actor goes there with hard affinity; an actor that still
    dies before it runs, or does not start within ``actor_start_timeout_s``, is killed and the
    next node is tried. A round in which no node took it (every probe unanswered: a loaded
    machine, or nodes still starting workers) is tried again, up to ``max_attempts`` rounds.

    Raises:
        SupervisionLimitError: no live node took it in ``max_attempts`` rounds.
    """
    here = this_node_id()
    failures: list[str] = []
    for attempt in range(1, policy.max_attempts + 1):
        nodes = sorted((node for node in live_nodes() if node.cpus >= cpus),
                       key=lambda node: node.node_id != here)
        for node in nodes:
            where = f"{node.host} ({node.node_id[:12]})"
            if not probe_node(node.node_id, policy.node_probe_timeout_s):
                failures.append(f"{where} did not answer a probe within "
                                f"{policy.node_probe_timeout_s:g}s (round {attempt})")
                continue
            actor = create(NodeAffinitySchedulingStrategy(node.node_id, soft=False))
            try:
                actor_node(actor, policy.actor_start_timeout_s)
            except (RayActorError, GetTimeoutError) as exc:
                failures.append(f"{where}: {type(exc).__name__} (round {attempt})")
                _kill(actor)
                continue
            return actor
        if not nodes:
            failures.append(f"none has {cpus} CPU (round {attempt})")
        if attempt < policy.max_attempts:
            logger.warning("no live node took the replacement in round %d of %d; trying "
                           "again", attempt, policy.max_attempts)
    raise SupervisionLimitError("no live node took the replacement: " + "; ".join(failures))
