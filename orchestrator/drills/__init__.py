"""Recovery drills: real faults in a real short run, then a check of DESIGN section 4.

Modules, one job each (arrows are imports among them; there is no circle)::

    context    the DrillContext protocol, FaultPlan / FaultRecord, the drills' errors
    checker    the drill checker: Ledger.verify() plus drill-only checks over the folded run
    faults     process faults: pid lookup, SIGKILL and wait, SIGSTOP, the hook-armed kills
                                                                  -> context
    outages    database outages: PostgreSQL stopped, the SQLite lock held -> context
    crash      whole-job crashes: the job in a child process that kills itself, then a resume
                                                                  -> context, faults
    scenarios  each scenario's name, points, steps, inject and expect
                                                                  -> context, checker, faults,
                                                                     outages, crash
    node_loss  kill-node on a local multi-node cluster            -> context, checker, scenarios
    planning   which drills to run (default or seeded chaos plans)
                                                                  -> context, scenarios,
                                                                     node_loss
    watchdog   runs a job on a thread under the drill's deadlines -> context
    runner     runs a drill with its JobHooks, judges it, records the verdict
                                                                  -> all of the above
"""

from orchestrator.drills.context import DrillContext, DrillError, FaultPlan
from orchestrator.drills.planning import plan_drills
from orchestrator.drills.runner import DrillOptions, DrillResult, run_drill, run_drills
from orchestrator.drills.scenarios import SCENARIOS, Scenario

__all__ = [
    "SCENARIOS",
    "DrillContext",
    "DrillError",
    "DrillOptions",
    "DrillResult",
    "FaultPlan",
    "Scenario",
    "plan_drills",
    "run_drill",
    "run_drills",
]
