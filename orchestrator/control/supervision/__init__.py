"""Supervision: liveness and replacement of every actor of a run, behind a step boundary.

- :mod:`.supervisor`: the facade the training loop calls (``begin_step``, ``train_step``,
  ``end_step``), torchft-style: the loop only asks.
- :mod:`.failure_policy`: every limit, and ``FailurePolicy.run``, the one retry loop.
- :mod:`.cell_group`: the cells as mechanism (bounded calls, ``cell_state`` events).
- :mod:`.cell_failover`: a loss, a promotion, the quorum, a step applied once, heals.
- :mod:`.engine_restarts`: dead or frozen engines replaced and handed over.
- :mod:`.manager_watch`: the rollout manager's calls, drains and replacement.
"""

from orchestrator.control.supervision.cell_group import CellGroup, CellState
from orchestrator.control.supervision.counters import SupervisionCounters
from orchestrator.control.supervision.failure_policy import FailurePolicy, RestartBudget
from orchestrator.control.supervision.supervisor import Supervisor

__all__ = [
    "CellGroup",
    "CellState",
    "FailurePolicy",
    "RestartBudget",
    "Supervisor",
    "SupervisionCounters",
]
