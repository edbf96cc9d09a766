"""Placement (issue 14, item 2 and 4): the placement-group strategy, where a replacement goes
after a loss (live nodes only, a suspect node probed before reuse), and "died before it ran"
retried on another node under the policy's limit.

The decision logic is tested without Ray (nodes, probes and starts are stand-ins); one Ray test
places real actors on the session's one-node cluster and records their node.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
from ray.exceptions import ActorDiedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.control.placement import placer as placement_module
from orchestrator.control.placement.nodes import NodeInfo
from orchestrator.control.placement.placer import (Placement, _Role, group_strategy,
                                                   start_on_a_live_node)
from orchestrator.errors import SupervisionLimitError
from orchestrator.control.supervision.failure_policy import FailurePolicy

A, B, C = (NodeInfo(name * 56, f"10.0.0.{i}", 2.0) for i, name in enumerate("abc", 1))
POLICY = FailurePolicy(heartbeat_timeout_s=0.01, max_attempts=3)


@pytest.mark.parametrize(("mode", "nodes", "actors", "expected"), [
    ("spread", 3, 2, "STRICT_SPREAD"),
    ("spread", 2, 2, "STRICT_SPREAD"),
    ("spread", 1, 2, "SPREAD"),
    ("pack", 3, 2, "PACK"),
])
def test_group_strategy(mode: str, nodes: int, actors: int, expected: str) -> None:
    assert group_strategy(mode, nodes, actors) == expected


class Cluster:
    """Stand-ins for Ray: the nodes it lists alive, which answer a probe, which kill an actor
    before it runs. Records every probe and every node an actor was sent to."""

    def __init__(self, listed: list[NodeInfo], answering: set[str] | None = None,
                 killing: set[str] | None = None) -> None:
        self.listed = listed
        self.answering = answering if answering is not None else {n.node_id for n in listed}
        self.killing = killing or set()
        self.probed: list[str] = []
        self.sent_to: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, placement: Placement) -> None:
        monkeypatch.setattr(placement_module, "live_nodes", lambda: list(self.listed))
        monkeypatch.setattr(placement_module, "probe_node", self.probe)
        monkeypatch.setattr(placement_module, "actor_node", self.start)
        monkeypatch.setattr(placement, "_bundle_node", lambda role, index: None)
        monkeypatch.setattr(placement, "_reserve",
                            lambda role, count: _Role(role, launch.ROLE_CPUS[role], None))

    def probe(self, node_id: str, timeout_s: float) -> bool:
        self.probed.append(node_id)
        return node_id in self.answering

    def start(self, actor: dict[str, Any], timeout_s: float) -> NodeInfo:
        node_id = actor["strategy"].node_id
        self.sent_to.append(node_id)
        if node_id in self.killing:
            raise ActorDiedError()
        return next(node for node in self.listed if node.node_id == node_id)


def _factory(config: RunConfig, actor_id: str) -> dict[str, Any]:
    return {"id": actor_id, "strategy": launch.scheduling_options()["scheduling_strategy"]}


def _placement(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, placed: dict[str, NodeInfo],
               mode: str = "spread") -> tuple[Placement, Any]:
    config = RunConfig(run_id="placement", placement=mode)
    placement = Placement(config, POLICY)
    cluster.install(monkeypatch, placement)
    for actor_id, node in placed.items():
        placement._nodes[actor_id] = node
        placement._role_of[actor_id] = actor_id.split("-")[0]
    return placement, lambda actor_id: placement.placed(_factory, "cell")(config, actor_id)


def test_a_replacement_avoids_the_node_it_was_lost_on_and_the_other_cells(monkeypatch) -> None:
    # cell-0 was lost on A, which Ray still lists alive (its health check has not failed yet).
    cluster = Cluster([A, B, C])
    placement, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B})

    actor = create("cell-0")

    assert isinstance(actor["strategy"], NodeAffinitySchedulingStrategy)
    assert not actor["strategy"].soft
    assert cluster.sent_to == [C.node_id]
    assert cluster.probed == []  # a free, trusted node: the suspect is not even asked
    assert placement.node_fields("cell-0") == {"node_id": C.node_id, "host": C.host}


def test_a_suspect_node_that_does_not_answer_is_not_used(monkeypatch) -> None:
    # Only A (dying, still listed) and B (holding cell-1) are left: A is probed, stays silent.
    cluster = Cluster([A, B], answering={B.node_id})
    _, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B})

    create("cell-0")

    assert cluster.probed == [A.node_id]
    assert cluster.sent_to == [B.node_id]


def test_a_suspect_node_that_answers_is_used_again_to_keep_cells_apart(monkeypatch) -> None:
    # The actor died (a killed process), not its node: A answers, so cells stay spread.
    cluster = Cluster([A, B])
    _, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B})

    create("cell-0")

    assert cluster.probed == [A.node_id]
    assert cluster.sent_to == [A.node_id]


def test_on_a_one_node_cluster_the_only_node_is_used_without_a_probe(monkeypatch) -> None:
    cluster = Cluster([A])
    _, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": A})

    create("cell-0")

    assert cluster.probed == []
    assert cluster.sent_to == [A.node_id]


def test_died_before_it_ran_is_retried_on_another_node(monkeypatch) -> None:
    # C dies under the new actor (its node was dying unnoticed): placed again, on B.
    cluster = Cluster([A, B, C], answering=set(), killing={C.node_id})
    placement, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B})

    create("cell-0")

    assert cluster.sent_to == [C.node_id, B.node_id]
    assert placement.node_fields("cell-0")["node_id"] == B.node_id


def test_a_replacement_that_cannot_start_anywhere_hits_the_policy_limit(monkeypatch) -> None:
    cluster = Cluster([A, B, C], killing={A.node_id, B.node_id, C.node_id})
    _, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B})

    with pytest.raises(SupervisionLimitError, match="could not be placed in 3 attempts"):
        create("cell-0")

    assert len(cluster.sent_to) == POLICY.max_attempts
    assert len(set(cluster.sent_to)) == POLICY.max_attempts  # never the same node twice


class SlowToAnswer(Cluster):
    """A loaded node: its first probe goes unanswered, the next ones are answered."""

    def __init__(self, listed: list[NodeInfo]) -> None:
        super().__init__(listed)
        self.timeouts: list[float] = []

    def probe(self, node_id: str, timeout_s: float) -> bool:
        self.timeouts.append(timeout_s)
        return super().probe(node_id, timeout_s) and self.probed.count(node_id) > 1


def _start_replacement(monkeypatch, cluster: Cluster, policy: FailurePolicy) -> dict[str, Any]:
    monkeypatch.setattr(placement_module, "live_nodes", lambda: list(cluster.listed))
    monkeypatch.setattr(placement_module, "probe_node", cluster.probe)
    monkeypatch.setattr(placement_module, "actor_node", cluster.start)
    monkeypatch.setattr(placement_module, "this_node_id", lambda: A.node_id)
    return start_on_a_live_node(lambda strategy: {"strategy": strategy}, 0.5, policy)


def test_a_replacement_probe_has_its_own_deadline_and_a_silent_round_is_retried(
        monkeypatch) -> None:
    cluster = SlowToAnswer([A])
    policy = FailurePolicy(heartbeat_timeout_s=0.01, node_probe_timeout_s=42.0, max_attempts=3)

    actor = _start_replacement(monkeypatch, cluster, policy)

    assert actor["strategy"].node_id == A.node_id
    assert cluster.probed == [A.node_id, A.node_id]  # unanswered once, then answered
    assert cluster.timeouts == [42.0, 42.0]  # not the heartbeat timeout


def test_a_replacement_no_node_answers_fails_after_the_policys_rounds(monkeypatch) -> None:
    cluster = Cluster([A, B], answering=set())
    policy = FailurePolicy(node_probe_timeout_s=0.5, max_attempts=2)

    with pytest.raises(SupervisionLimitError, match=r"did not answer a probe within 0.5s "
                                                    r"\(round 2\)"):
        _start_replacement(monkeypatch, cluster, policy)
    assert cluster.probed == [A.node_id, B.node_id] * 2


def test_pack_puts_a_replacement_with_the_other_actors(monkeypatch) -> None:
    cluster = Cluster([A, B, C])
    _, create = _placement(monkeypatch, cluster, {"cell-0": A, "cell-1": B, "engine-0": B},
                           mode="pack")

    create("cell-0")

    assert cluster.sent_to == [B.node_id]


def test_scheduling_options_apply_only_inside_scheduled() -> None:
    strategy = NodeAffinitySchedulingStrategy("d" * 56, soft=False)
    assert launch.scheduling_options() == {}
    with launch.scheduled(strategy):
        assert launch.scheduling_options() == {"scheduling_strategy": strategy}
    assert launch.scheduling_options() == {}


class Pinger:
    def ping(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _pinger(config: RunConfig, actor_id: str) -> Any:
    return ray.remote(num_cpus=launch.CELL_CPUS, **launch.scheduling_options())(Pinger).remote()


@ray.remote(num_cpus=0.01)
class _Replacement:
    def ping(self) -> str:
        return ray.get_runtime_context().get_node_id()


@pytest.mark.ray
def test_a_replacement_starts_when_a_probe_takes_longer_than_a_heartbeat(ray_cluster) -> None:
    # A heartbeat no probe task can meet (it starts a worker): the probe's own deadline holds.
    policy = FailurePolicy(heartbeat_timeout_s=1e-6, node_probe_timeout_s=60.0)

    actor = start_on_a_live_node(
        lambda strategy: _Replacement.options(scheduling_strategy=strategy).remote(), 0.01,
        policy)

    try:
        assert ray.get(actor.ping.remote(), timeout=60) == ray.get_runtime_context().get_node_id()
    finally:
        ray.kill(actor, no_restart=True)


@pytest.mark.ray
def test_actors_go_to_their_bundle_then_replacements_to_a_live_node(ray_cluster) -> None:
    config = RunConfig(run_id="placement-ray", num_cells=2)
    placement = Placement(config, FailurePolicy(actor_start_timeout_s=120.0))
    create = placement.placed(_pinger, "cell")
    try:
        first = [create(config, f"cell-{i}") for i in range(2)]
        nodes = ray.get([actor.ping.remote() for actor in first], timeout=120)
        assert [placement.node_fields(f"cell-{i}")["node_id"] for i in range(2)] == nodes
        ray.kill(first[0], no_restart=True)

        replacement = create(config, "cell-0")

        assert ray.get(replacement.ping.remote(), timeout=60) == nodes[0]  # the only node
        assert placement.node_fields("cell-0")["node_id"] == nodes[0]
    finally:
        placement.release()
    assert ray.util.placement_group_table() and all(
        group["state"] == "REMOVED" for group in ray.util.placement_group_table().values()
        if group["name"].startswith("placement-ray"))
