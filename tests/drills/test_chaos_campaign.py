"""The chaos campaign end to end: a real run under a seeded nemesis, judged by its ledger.

The short campaign (1 seed, 40 steps, SQLite) runs in ``make test``: every fault of its
schedule must have fired (counted from the ledger's ``fault_injected`` events, by kind), the
driver kills must have been resumed in new processes, and the verdict must be green. The
longer one (every kind, 200 steps) is ``slow`` (``make drills``; ``make chaos`` runs many seeds).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ledger import EventKind, Ledger
from orchestrator.chaos.campaign import CampaignOptions, run_campaign
from orchestrator.chaos.nemesis import FaultKind, draw_schedule
from orchestrator.cli import main

# Seed 5 draws 8 faults of 7 kinds in 40 steps at a mean interval of 4, two of which kill the
# job (kill-driver, kill-everything). A frozen engine is found by the probe timeout (about 40 s
# at the drills' heartbeat), so the freezes are left to the long campaign and to
# test_frozen_actors_are_replaced_and_the_run_goes_on, to keep this one short.
SHORT = CampaignOptions(steps=40, seed=5, mean_interval=4.0, overlap=True,
                        exclude=(FaultKind.FREEZE_ENGINE, FaultKind.FREEZE_FOLLOWER,
                                 FaultKind.FREEZE_ROLLOUT_MANAGER))
CRASH_KINDS = {FaultKind.KILL_DRIVER, FaultKind.KILL_EVERYTHING}


def fault_events_by_kind(ledger_url: str, run_id: str) -> Counter[str]:
    ledger = Ledger.open(ledger_url, readonly=True)
    try:
        return Counter(event.payload["fault"]["kind"] for event in ledger.events(run_id)
                       if event.kind == EventKind.FAULT_INJECTED)
    finally:
        ledger.close()


def test_the_short_campaign_draws_at_least_six_kinds_with_job_kills() -> None:
    kinds = [k for k in FaultKind if k not in (*SHORT.exclude, FaultKind.KILL_NODE)]
    schedule = draw_schedule(SHORT.seed, SHORT.steps, mean_interval=SHORT.mean_interval,
                             kinds=kinds, overlap=SHORT.overlap)

    assert len({fault.kind for fault in schedule}) >= 6
    assert CRASH_KINDS <= {fault.kind for fault in schedule}
    chained = {fault.after: fault for fault in schedule if fault.after is not None}
    # One chain starts in a resume: a fault planned into the recovery of a job kill.
    assert any(schedule[after].kind in CRASH_KINDS for after in chained)


def test_a_short_campaign_fires_every_fault_recovers_and_is_green(tmp_path: Path) -> None:
    result = run_campaign(CampaignOptions(**{**SHORT.__dict__, "runs_dir": tmp_path}))

    assert result.verdict.breaches == []
    assert result.ok and result.verdict.steps_trained == SHORT.steps
    planned = Counter(fault.kind.value for fault in result.schedule)
    assert fault_events_by_kind(result.ledger_url, result.run_id) == planned
    assert len(planned) >= 6
    assert sorted(f.index for f in result.fired) == [f.index for f in result.schedule]
    assert all(f.recovery_s is not None and f.recovery_s >= 0 for f in result.fired)
    fired = {f.index: f for f in result.fired}
    chained = [f for f in result.schedule if f.after is not None]
    assert all(fired[f.after].fired_at <= fired[f.index].fired_at for f in chained)
    # Judged from the ledger, not the plan: faults really landed inside a recovery.
    assert sum(1 for f in result.fired if f.during_recovery_of is not None) >= 2
    crashes = sum(1 for fault in result.schedule if fault.kind in CRASH_KINDS)
    assert result.job_processes == 1 + crashes
    assert any("kill-node left out" in note for note in result.notes)


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps"),
    (["--mean-interval", "0"], "--mean-interval must be positive"),
    (["--exclude", "kill-the-moon"], "unknown fault kind 'kill-the-moon'"),
    (["--steps", "4"], "leaves no step for a fault"),
    (["--local-nodes", "3"], "--local-nodes needs a PostgreSQL --db"),
    (["--reward-tolerance", "-1"], "--reward-tolerance must be 0 or more"),
])
def test_bad_campaign_flags_are_one_line_and_exit_2(capsys, tmp_path: Path, flags: list[str],
                                                     message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["chaos", "--runs-dir", str(tmp_path), *flags])

    error = capsys.readouterr().err
    assert exited.value.code == 2
    assert error.startswith("orchestrator: error:") and message in error
    assert error.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing ran, nothing was written


@pytest.mark.slow
def test_frozen_actors_are_replaced_and_the_run_goes_on(tmp_path: Path) -> None:
    freezes = (FaultKind.FREEZE_ENGINE, FaultKind.FREEZE_FOLLOWER,
               FaultKind.FREEZE_ROLLOUT_MANAGER)
    options = CampaignOptions(steps=24, seed=12, mean_interval=4.0, runs_dir=tmp_path,
                              exclude=tuple(k for k in FaultKind if k not in freezes))

    result = run_campaign(options)

    assert result.verdict.breaches == []
    assert {fault.kind for fault in result.fired} == set(freezes)
    assert sorted(f.index for f in result.fired) == [f.index for f in result.schedule]
    ledger = Ledger.open(result.ledger_url, readonly=True)
    try:
        events = list(ledger.events(result.run_id))
    finally:
        ledger.close()
    frozen_cells = {e.payload["detail"]["cell"] for e in events
                    if e.kind == EventKind.FAULT_INJECTED and "cell" in e.payload["detail"]}
    healed = {e.cell_id for e in events
              if e.kind == EventKind.CELL_STATE and e.payload.get("state") == "healed"}
    assert frozen_cells and frozen_cells <= healed  # dropped from the quorum, then healed
    assert all(f.recovery_s is not None for f in result.fired)


@pytest.mark.slow
def test_a_long_campaign_of_every_kind_is_green(tmp_path: Path) -> None:
    # The learning check (--reward-tolerance) is make chaos's: on 2026-12-01 seed 1's policy
    # collapsed to one-token answers from step 137 (a breach not yet explained), while every
    # ledger check stayed clean; this test holds the ledger checks.
    result = run_campaign(CampaignOptions(steps=200, seed=1, runs_dir=tmp_path))

    assert result.verdict.breaches == []
    planned = Counter(fault.kind.value for fault in result.schedule)
    assert fault_events_by_kind(result.ledger_url, result.run_id) == planned
