"""Recovery drills on real processes: faults fire, the run recovers, the checker agrees.

CI runs a fast subset (three SQLite drills, the database outage and the zombie on PostgreSQL,
and two drills that must go red); ``make drills`` runs the whole matrix on both backends.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import ray

from ledger import EventKind, Ledger
from orchestrator.control import launch
from orchestrator.control.driver import TrainingJob
from orchestrator.control.engine_pool.ray_pool import RayEnginePool
from orchestrator.control.publisher import PublishOutcome, Publisher
from orchestrator.control.supervision import Supervisor
from orchestrator.drills import (
    SCENARIOS,
    DrillError,
    DrillOptions,
    DrillResult,
    FaultPlan,
    Scenario,
    plan_drills,
    run_drill,
)
from orchestrator.rollout.manager import RolloutManager

FAST_SQLITE = ["kill-publisher-mid-train", "kill-publisher-after-commit", "kill-engine",
               "kill-driver"]
FAST_POSTGRES = ["database-outage", "zombie-publisher"]


def drill(scenario: str, tmp_path: Path, db: str | None = None, **options) -> DrillResult:
    [plan] = plan_drills([scenario])
    return run_drill(plan, DrillOptions(runs_dir=tmp_path / "runs", db=db, **options))


def assert_passed_and_recorded(result: DrillResult) -> None:
    assert result.passed, result.problems
    assert result.recover_s is not None and result.recover_s >= 0
    assert result.version_after > result.version_before >= 1
    assert result.negative_staleness == 0 and result.groups_lost == 0
    ledger = Ledger.open(result.ledger_url, readonly=True)
    try:
        kinds = [e.kind for e in ledger.events(result.run_id)]
        verdicts = [e.payload for e in ledger.events(result.run_id)
                    if e.kind == EventKind.DRILL_VERDICT]
        assert ledger.verify(result.run_id).ok
    finally:
        ledger.close()
    assert kinds.index(EventKind.DRILL_STARTED) < kinds.index(EventKind.FAULT_INJECTED) < (
        kinds.index(EventKind.DRILL_VERDICT))
    assert verdicts[-1]["scenario"] == result.plan.scenario
    assert verdicts[-1]["verdict"] == "pass"


# ----------------------------------------------------------------------------- planning

def test_chaos_plans_are_reproducible_from_the_seed() -> None:
    first = plan_drills(["all"], seed=7, repeat=3)
    again = plan_drills(["all"], seed=7, repeat=3)
    other = plan_drills(["all"], seed=8, repeat=3)

    assert first == again
    assert first != other
    assert len(first) == 3 * len(SCENARIOS)
    for plan in first:
        assert plan.step in SCENARIOS[plan.scenario].steps
        assert plan.point in SCENARIOS[plan.scenario].points


def test_unknown_scenario_is_a_drill_error() -> None:
    with pytest.raises(DrillError, match="unknown scenario 'kill-the-moon'"):
        plan_drills(["kill-the-moon"])


def test_cli_rejects_an_unknown_scenario_in_one_line(capsys) -> None:
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["drill", "--scenario", "kill-the-moon"])

    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and "unknown scenario" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- CI subset

@pytest.mark.ray
@pytest.mark.parametrize("scenario", FAST_SQLITE)
def test_drill_recovers_on_sqlite(ray_cluster, tmp_path: Path, scenario: str) -> None:
    result = drill(scenario, tmp_path)

    assert_passed_and_recorded(result)
    if scenario == "kill-publisher-after-commit":
        assert result.detail["committed"] == result.version_before  # committed, then killed
    if scenario == "kill-engine":
        assert result.detail["engine_restarts"] == 1


@pytest.mark.ray
@pytest.mark.postgres
@pytest.mark.parametrize("scenario", FAST_POSTGRES)
def test_drill_recovers_on_postgres(ray_cluster, tmp_path: Path, pg_url: str,
                                    pg_admin_engine, scenario: str) -> None:
    result = drill(scenario, tmp_path, db=pg_url)
    pg_admin_engine.dispose()  # its pooled connections did not survive a server restart

    assert_passed_and_recorded(result)
    if scenario == "database-outage":
        assert result.detail["backend"] == "postgresql"
        assert result.detail["outage_s"] >= result.plan.hold_s
    if scenario == "zombie-publisher":
        assert result.detail["zombie_attempts"]["commit"] == "FencedError"
        assert result.detail["zombie_attempts"]["transfer"] == "StaleEpochError"


# ----------------------------------------------------------------------------- drills can fail

@pytest.mark.ray
def test_a_drill_whose_fault_never_fires_fails(ray_cluster, tmp_path: Path,
                                               monkeypatch) -> None:
    real = SCENARIOS["kill-follower"]
    idle = Scenario(real.name, real.points, real.steps, lambda drill, job: None, real.expect)
    monkeypatch.setitem(SCENARIOS, "kill-follower", idle)

    result = drill("kill-follower", tmp_path)

    assert not result.passed
    assert result.problems[0] == "the fault never fired"


class TrustingRolloutManager(RolloutManager):
    """Half of the planted bug: takes any pushed version and never reads the ledger."""

    def set_weight_version(self, version: int) -> int:
        self._weight_version = version
        self._rollout.notify()  # a new version reopens admission, as the real manager does
        return version

    def _read_ledger_head(self) -> int:
        return self._weight_version


def create_trusting_manager(config, ledger_url, run_id, engines, scheduling_strategy=None):
    """Starts the trusting manager (and replaces a dead one with another).

    Without a staleness bound, as in the seed: admission control paced on the counter would
    hold every group back once the counter drops below the groups already trained, and the
    run would hang with nothing screened after the reset (one CI run, 2026-12-05). Unbounded,
    the engines keep generating at the ledger's versions, so every drain after the reset
    screens groups newer than the counter, whatever the timing.
    """
    make_prompt = functools.partial(launch._make_prompt, config.seed)
    config = config.model_copy(update={"max_weight_staleness": None})
    options = {"num_cpus": launch.MANAGER_CPUS}
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    actor = ray.remote(**options)(TrustingRolloutManager)
    return actor.remote(ledger_url, run_id, config, make_prompt, RayEnginePool(engines))


class CountingPublisher(Publisher):
    """Publishes through the real path, then pushes its own count of publishes over the
    ledger's version; a new publisher (a new epoch) starts counting from 1 again."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.count, self.epoch = 0, None

    def publish_weights(self) -> PublishOutcome:
        outcome = super().publish_weights()
        if outcome.epoch != self.epoch:  # a new publisher: from 1
            self.count, self.epoch = 0, outcome.epoch
        self.count += 1
        # The real path pushed the ledger's version without waiting for the answer. The
        # manager is an async actor, which Ray does not run in submission order: unsettled,
        # that push could land after the count and undo the planted bug (one CI run,
        # 2026-12-06, went green so). Settled first, the count is always the last word.
        self._manager.settle_push()
        ray.get(self._manager.manager.set_weight_version.remote(self.count))
        return outcome


class InMemoryCounterJob(TrainingJob):
    """The other half (the seed's bug, miles-style): the driver counts its own publishes and
    pushes that count; a new publisher after a failover starts counting from 1 again. A test
    double built by subclassing, not a flag in production code."""

    def __init__(self, config, ledger, layout, options) -> None:
        super().__init__(config, ledger, layout, options)
        self.supervisor = Supervisor(config, ledger, layout, create_engine=options.engine_factory,
                                     create_manager=create_trusting_manager)
        self.publisher = CountingPublisher.of(
            self.supervisor, before_publish=lambda: self.hooks.before_publish(self))


@pytest.mark.ray
def test_a_version_counter_instead_of_the_ledger_turns_the_drill_red(ray_cluster,
                                                                     tmp_path: Path) -> None:
    # After the failover the counter restarts at 1 while engines serve the ledger's v5+: the
    # staleness of every new group goes negative, none is trained, and the deadline reports
    # the count. The deadline counts from the fault: on a loaded machine the start alone can
    # take a minute. Only a drain requested after the counter's reset can see it, and
    # fully-async requests each drain a step ahead: with the drill's usual 3 steps after the
    # fault, one CI run (2026-12-04) finished with no such drain and went green. 6 steps
    # leave several.
    result = drill("kill-publisher-after-commit", tmp_path, job_class=InMemoryCounterJob,
                   recover_deadline_s=30, recover_steps=6)

    assert not result.passed
    assert any(re.search(r"negative staleness counted (so far: )?[1-9]", p)
               for p in result.problems), result.problems


# ----------------------------------------------------------------------------- the matrix

@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matrix_on_sqlite(ray_cluster, tmp_path: Path, scenario: str) -> None:
    assert_passed_and_recorded(drill(scenario, tmp_path))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.postgres
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matrix_on_postgres(ray_cluster, tmp_path: Path, pg_url: str, pg_admin_engine,
                           scenario: str) -> None:
    result = drill(scenario, tmp_path, db=pg_url)
    pg_admin_engine.dispose()  # after database-outage its pooled connections are stale

    assert_passed_and_recorded(result)


@pytest.mark.slow
@pytest.mark.ray
def test_chaos_mode_on_sqlite(ray_cluster, tmp_path: Path) -> None:
    options = DrillOptions(runs_dir=tmp_path / "runs")
    for plan in plan_drills(["kill-publisher-mid-train", "kill-engine", "kill-follower"],
                            seed=11, repeat=2):
        assert_passed_and_recorded(run_drill(plan, options))


def test_fault_plan_is_declared_up_front() -> None:
    plan = FaultPlan("kill-engine", step=3, point="between-steps")
    assert (plan.scenario, plan.step, plan.point) == ("kill-engine", 3, "between-steps")
