"""The ledger URL of a run on a cluster: refused up front unless every node can open it.

Every node's actors open the ledger themselves (cells to publish, the rollout manager to read
the head). On a cluster of more than one node:

- a SQLite URL is refused (the file is on one machine; the others would open, or create, a
  file of their own), and so is any relative URL (resolved in each worker's directory);
- a PostgreSQL URL is tried from every node (a task pinned to it connects and runs
  ``SELECT 1``) before anything is written.

On one node (the default local cluster) only a relative SQLite URL on a cluster the job joined
(``--ray-address``) is refused: the workers of a ``ray start`` cluster do not run in the
driver's directory.
"""

from __future__ import annotations

import os

import ray
import sqlalchemy as sa
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.control.placement.nodes import NodeInfo, live_nodes
from orchestrator.errors import StartupError

__all__ = ["check_ledger_url", "probe_ledger_from_every_node"]

_USE_POSTGRES = "use a PostgreSQL URL reachable from every node"
_CONNECT_TIMEOUT_S = 10


def _shown(url: sa.URL) -> str:
    return url.render_as_string(hide_password=True)


def check_ledger_url(url: str, nodes: int, joined: bool) -> None:
    """Refuse a ledger URL that the nodes of this cluster cannot share (no I/O).

    Args:
        url: the run's ledger URL.
        nodes: alive nodes in the cluster.
        joined: the job joined an existing cluster (``--ray-address``).

    Raises:
        StartupError: one line, with what to use instead.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return  # not a URL at all: the ledger says so, in its own words
    sqlite = parsed.get_backend_name() == "sqlite"
    relative = sqlite and not os.path.isabs(parsed.database or "")
    if nodes > 1 and sqlite:
        raise StartupError(f"the ledger {_shown(parsed)} is a SQLite file, which the other "
                           f"{nodes - 1} nodes of this cluster cannot open: {_USE_POSTGRES}")
    if relative and (joined or nodes > 1):
        raise StartupError(f"the ledger {_shown(parsed)} is a relative path, resolved in each "
                           f"worker's directory: use an absolute path, or {_USE_POSTGRES}")


@ray.remote(num_cpus=0, max_retries=0)
def _open_ledger(url: str) -> str | None:
    """On one node: connect to ``url`` and run ``SELECT 1``; None, or why it failed."""
    connect_args = {"connect_timeout": _CONNECT_TIMEOUT_S}
    engine = sa.create_engine(url, connect_args=connect_args, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - reported to the driver as one line
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    finally:
        engine.dispose()
    return None


def probe_ledger_from_every_node(url: str, timeout_s: float = 60.0,
                                 nodes: list[NodeInfo] | None = None) -> None:
    """Open the PostgreSQL ledger at ``url`` from every alive node (nothing is written).

    Raises:
        StartupError: a node cannot reach it, or did not answer within ``timeout_s``.
    """
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("", "psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    target = parsed.render_as_string(hide_password=False)
    nodes = nodes if nodes is not None else live_nodes()
    refs = {
        node: _open_ledger.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        ).remote(target)
        for node in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for node, ref in refs.items():
        where = f"node {node.host} ({node.node_id[:12]})"
        if ref not in ready:
            raise StartupError(f"{where} did not open the ledger {_shown(parsed)} within "
                               f"{timeout_s:g}s: {_USE_POSTGRES}")
        try:
            error = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - e.g. the package is missing on that node
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if error is not None:
            raise StartupError(f"{where} cannot open the ledger {_shown(parsed)}: {error}; "
                               f"{_USE_POSTGRES}")
