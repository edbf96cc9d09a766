"""When the nemesis fires a fault planned into another's recovery (``--overlap``).

The injections themselves (real kills of real processes) are exercised by the campaigns in
``test_chaos_campaign.py``; here a recording subclass stands in for them, so the order of the
hook points, the only thing under test, can be driven step by step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.chaos.injection import MAX_DEFERRALS, ChaosHooks, FaultContext
from orchestrator.chaos.nemesis import FaultKind, PlannedFault

KILL_ENGINE, KILL_FOLLOWER = FaultKind.KILL_ENGINE, FaultKind.KILL_FOLLOWER


class RecordingHooks(ChaosHooks):
    """Fires nothing: notes (hook point, fault index) and marks the fault fired, or, for the
    indices in ``refuse``, raises as a fault that cannot be injected yet does. No ledger: the
    injections that would write to it are what this stands in for."""

    def __init__(self, schedule: list[PlannedFault], already_fired: set[int] = frozenset(),
                 refuse: set[int] = frozenset(), silent: set[int] = frozenset()) -> None:
        no_ledger: Any = None
        super().__init__(schedule, set(already_fired), seed=1, ledger=no_ledger,
                         ledger_url="sqlite://")
        self.refuse, self.silent = set(refuse), set(silent)
        self.fired_log: list[tuple[str, int]] = []
        self.hook = "?"

    def _inject(self, ctx: FaultContext, job: Any, step: int) -> None:
        index = ctx.fault.index
        if index in self.refuse:
            raise RuntimeError("no live follower to freeze")
        self.fired_log.append((self.hook, index))
        ctx.record.fired = index not in self.silent  # a silent one is armed, never lands


def run_steps(hooks: RecordingHooks, steps: range) -> list[tuple[int, str, int]]:
    """Drive ``hooks`` through ``steps`` as the driver does; returns (step, hook, index)."""
    job = SimpleNamespace(step=0)
    fired = []
    for step in steps:
        job.step = step
        for name, call in (("before_train_step", lambda: hooks.before_train_step(job, step)),
                           ("after_train_step", lambda: hooks.after_train_step(job, step)),
                           ("before_publish", lambda: hooks.before_publish(job)),
                           ("on_step_end", lambda: hooks.on_step_end(job, step))):
            hooks.hook = name
            before = len(hooks.fired_log)
            call()
            fired += [(step, hook, index) for hook, index in hooks.fired_log[before:]]
    return fired


def test_a_chained_fault_fires_at_the_first_hook_point_after_its_predecessor() -> None:
    schedule = [PlannedFault(0, 3, KILL_ENGINE), PlannedFault(1, 3, KILL_FOLLOWER, after=0),
                PlannedFault(2, 3, FaultKind.DATABASE_OUTAGE, after=1)]

    fired = run_steps(RecordingHooks(schedule), range(8))

    # Fault 0 at the end of step 3; each chained one at the next hook point, inside step 4,
    # before that step publishes (the commit that would end the recovery).
    assert fired == [(3, "on_step_end", 0), (4, "before_train_step", 1),
                     (4, "after_train_step", 2)]


def test_kinds_that_act_later_in_a_step_wait_for_a_point_still_ahead_of_it() -> None:
    schedule = [PlannedFault(0, 2, KILL_ENGINE), PlannedFault(1, 2, KILL_FOLLOWER, after=0),
                PlannedFault(2, 2, FaultKind.KILL_PUBLISHER_MID_TRAIN, after=1),
                PlannedFault(3, 2, FaultKind.ZOMBIE_PUBLISHER, after=2)]

    fired = run_steps(RecordingHooks(schedule), range(8))

    assert fired == [(2, "on_step_end", 0), (3, "before_train_step", 1),
                     (3, "on_step_end", 2),  # a mid-train kill: not after the train step
                     (4, "on_step_end", 3)]  # a zombie publisher: only at a step's end


def test_a_resumed_job_fires_the_chain_of_a_fault_that_killed_the_last_one_first() -> None:
    schedule = [PlannedFault(0, 5, FaultKind.KILL_DRIVER),
                PlannedFault(1, 5, KILL_ENGINE, after=0)]

    fired = run_steps(RecordingHooks(schedule, already_fired={0}), range(6, 9))

    assert fired == [(6, "before_train_step", 1)]


def test_a_chained_fault_is_released_when_its_predecessor_never_fires() -> None:
    schedule = [PlannedFault(0, 2, KILL_FOLLOWER), PlannedFault(1, 2, KILL_ENGINE, after=0),
                PlannedFault(2, 20, KILL_FOLLOWER), PlannedFault(3, 20, KILL_ENGINE, after=2)]

    refused = RecordingHooks(schedule, refuse={0, 2})
    armed_only = RecordingHooks(schedule, silent={0, 2})

    # Refused until given up: the chain fires at a step's end, MAX_DEFERRALS steps late.
    assert run_steps(refused, range(40)) == [(2 + MAX_DEFERRALS, "on_step_end", 1),
                                             (20 + MAX_DEFERRALS, "on_step_end", 3)]
    # Injected but never landing (an armed kill whose step never came): released after
    # waiting MAX_DEFERRALS steps.
    assert run_steps(armed_only, range(40)) == [
        (2, "on_step_end", 0), (2 + MAX_DEFERRALS, "on_step_end", 1),
        (20, "on_step_end", 2), (20 + MAX_DEFERRALS, "on_step_end", 3)]


@pytest.mark.parametrize("kind", [KILL_ENGINE, FaultKind.KILL_DRIVER])
def test_an_unchained_fault_still_fires_at_its_step_end(kind: FaultKind) -> None:
    fired = run_steps(RecordingHooks([PlannedFault(0, 4, kind)]), range(8))

    assert fired == [(4, "on_step_end", 0)]
