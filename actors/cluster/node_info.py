"""Which Ray node this process runs on: the one lookup (:func:`node_and_host`) behind the
``node_id`` and ``host`` recorded in the ledger's ``cell_state``, ``cell_promoted`` and
``engines_stamped`` events (so placement is auditable), the weight path's "same node?" and
the control plane's placement."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import ray

__all__ = ["EngineNodes", "node_and_host", "node_fields", "this_node_id"]

logger = logging.getLogger(__name__)


def node_and_host() -> tuple[str, str]:
    """``(node_id, host)`` of the Ray node this process runs on. Precondition: Ray is
    initialised in this process (a driver or a worker)."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def this_node_id() -> str:
    """The id of the Ray node this process runs on (see :func:`node_and_host`)."""
    return node_and_host()[0]


def node_fields() -> dict[str, str]:
    """``{"node_id", "host"}`` of the Ray node this process runs on; ``{}`` outside Ray (an
    actor class built as a plain object in a test)."""
    if not ray.is_initialized():
        return {}
    node_id, host = node_and_host()
    return {"node_id": node_id, "host": host}


def _engine_node(engine: Any) -> tuple[str, dict[str, str]]:
    """Runs inside an engine actor (through ``__ray_call__``): its id and node."""
    return str(engine.engine_id), node_fields()


class EngineNodes:
    """Engine id -> node, asked once per engine actor (a replaced engine is a new actor)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._known: dict[str, tuple[str, dict[str, str]]] = {}  # actor id -> (engine, node)

    def of(self, engines: Sequence[Any]) -> dict[str, dict[str, str]]:
        """The node of every engine in ``engines`` that answers (a dead one is left out; plain
        objects, which have no actor id, too)."""
        actor_ids = [getattr(engine, "_actor_id", None) for engine in engines]
        asked = {
            actor_id.hex(): engine.__ray_call__.remote(_engine_node)
            for actor_id, engine in zip(actor_ids, engines)
            if actor_id is not None and actor_id.hex() not in self._known
        }
        for key, ref in asked.items():
            try:
                self._known[key] = ray.get(ref, timeout=self.timeout_s)
            except Exception:  # noqa: BLE001 - a dead engine has no node to record
                logger.debug("engine actor %s did not say its node", key, exc_info=True)
        entries = [self._known.get(a.hex()) for a in actor_ids if a is not None]
        return {entry[0]: entry[1] for entry in entries if entry is not None}
