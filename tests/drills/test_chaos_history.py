"""The chaos history checker judged on histories written through the real ledger, and on the
same histories with one violation planted: each turns the verdict red and names the fault it
followed. And the nemesis schedule: seeded, Poisson-spaced, replayable from its record."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta

import pytest

from ledger import Event, EventKind, Ledger
from ledger.provenance import prompt_digest
from orchestrator.chaos import CampaignFacts, FaultKind, check_history, draw_schedule
from orchestrator.chaos.history import fell_below, first_low_step
from orchestrator.chaos.nemesis import schedule_from_payload

RUN = "chaos-run"
STEPS = 6


def _batch(step: int, trained: list[int], staleness_min: int = 0) -> dict:
    prompts = {"trained": trained, "dropped": {}, "recycled": 0, "next_index": max(trained) + 1}
    return {
        "train_step": step, "trainer_version": step - 1, "produced_version": None,
        "cells": ["c0", "c1"], "groups": len(trained), "samples": 4 * len(trained),
        "sample_versions": {str(max(step - 2, 0)): 4 * len(trained)},
        "token_version_span_max": 0, "mixed_version_samples": 0,
        "staleness": {"min": staleness_min, "avg": float(max(staleness_min, 0)), "max": 1},
        "prompt_digest": prompt_digest(trained), "prompts": prompts,
    }


def _fault(ledger: Ledger, index: int, kind: FaultKind, step: int) -> None:
    ledger.append(RUN, EventKind.FAULT_INJECTED, {
        "scenario": "chaos", "fault": {"index": index, "kind": kind.value, "step": step}})


def _step(ledger: Ledger, cell: str, epoch: int, step: int) -> int:
    ledger.append(RUN, EventKind.WEIGHT_UPDATE_STARTED, {"train_step": step, "transport": "full"},
                  cell_id=cell, epoch=epoch)
    version = ledger.commit_weights(RUN, cell_id=cell, epoch=epoch, train_step=step,
                                    transport="full")
    ledger.append(RUN, EventKind.ENGINES_STAMPED, {"version": version, "engine_ids": ["e0", "e1"]},
                  cell_id=cell, epoch=epoch)
    ledger.append(RUN, EventKind.BATCH_TRAINED, _batch(step, [2 * step - 2, 2 * step - 1]))
    return version


@pytest.fixture
def history(sqlite_url: str) -> list[Event]:
    """A legal campaign of six steps: a publisher failover after fault 0 (step 2) and a resume
    after fault 1 (step 4)."""
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run(RUN, config={})
        epoch = ledger.promote(RUN, "c0", reason="start")
        for step in (1, 2):
            _step(ledger, "c0", epoch, step)
        _fault(ledger, 0, FaultKind.KILL_PUBLISHER_MID_TRAIN, 2)
        epoch = ledger.promote(RUN, "c1", reason="failover")
        for step in (3, 4):
            _step(ledger, "c1", epoch, step)
        _fault(ledger, 1, FaultKind.KILL_DRIVER, 4)
        epoch = ledger.promote(RUN, "c0", reason="resume")
        ledger.append(RUN, EventKind.RUN_RESUMED, {
            "checkpoint_step": 4, "checkpoint_version": 4, "head_version": 4,
            "next_prompt_index": 8})
        for step in (5, 6):
            _step(ledger, "c0", epoch, step)
        ledger.append(RUN, EventKind.RUN_FINISHED, {"steps": STEPS})
        return list(ledger.events(RUN))


FACTS = CampaignFacts(target_steps=STEPS, hang_after_s=60.0)


def _replace(events: list[Event], pick: Callable[[Event], bool], **changes) -> list[Event]:
    """``events`` with the last event ``pick`` chooses changed by ``changes``."""
    index = max(i for i, event in enumerate(events) if pick(event))
    return [*events[:index], dataclasses.replace(events[index], **changes), *events[index + 1:]]


def _commit_of(version: int) -> Callable[[Event], bool]:
    return lambda event: event.kind == EventKind.WEIGHT_COMMITTED and event.version == version


def _batch_of(step: int) -> Callable[[Event], bool]:
    return lambda e: e.kind == EventKind.BATCH_TRAINED and e.payload["train_step"] == step


def test_a_legal_campaign_passes_with_its_faults_and_recoveries(history: list[Event]) -> None:
    verdict = check_history(history, FACTS)

    assert verdict.ok, [str(b) for b in verdict.breaches]
    assert [(f.index, f.kind) for f in verdict.faults] == [(0, "kill-publisher-mid-train"),
                                                           (1, "kill-driver")]
    assert verdict.steps_trained == STEPS
    assert all(seconds is not None and seconds >= 0 for seconds in verdict.recovery_s.values())


PLANTS: dict[str, tuple[Callable[[list[Event]], list[Event]], str, int]] = {
    "a version reused after a resume": (
        lambda events: _replace(events, _commit_of(5), version=4), "versions", 1),
    "a resume that records the wrong head": (
        lambda events: _replace(events, lambda e: e.kind == EventKind.RUN_RESUMED,
                                payload={"checkpoint_step": 4, "checkpoint_version": 4,
                                         "head_version": 3}), "versions", 1),
    "a write accepted from a fenced epoch": (
        lambda events: _replace(events, _commit_of(3), epoch=1, cell_id="c0"), "fencing", 0),
    "a prompt trained twice": (
        lambda events: _replace(events, _batch_of(5), payload=_batch(5, [3, 9])), "prompts", 1),
    "an engine stamped backwards": (
        lambda events: _replace(
            events, lambda e: e.kind == EventKind.ENGINES_STAMPED and e.payload["version"] == 6,
            payload={"version": 2, "engine_ids": ["e1"]}), "stamps", 1),
    "a negative staleness trained": (
        lambda events: _replace(events, _batch_of(3), payload=_batch(3, [4, 5], -1)),
        "staleness", 0),
    "a hang after a fault": (
        lambda events: [dataclasses.replace(e, recorded_at=e.recorded_at + timedelta(minutes=5))
                        if e.seq > max(f.seq for f in events
                                       if f.kind == EventKind.FAULT_INJECTED) else e
                        for e in events], "liveness", 1),
    "a run that stops short": (
        lambda events: [e for e in events if not (_batch_of(6)(e) or
                                                  e.kind == EventKind.RUN_FINISHED)],
        "liveness", 1),
}


@pytest.mark.parametrize("plant", PLANTS, ids=list(PLANTS))
def test_a_planted_violation_turns_the_verdict_red_and_names_its_fault(
        history: list[Event], plant: str) -> None:
    corrupt, check, fault_index = PLANTS[plant]

    verdict = check_history(corrupt(history), FACTS)

    assert not verdict.ok
    # The first breach is the planted one; what follows from it (a stamp of the version the
    # reused commit did not make) may be reported too, but never before the fault.
    assert verdict.breaches[0].check == check, [str(b) for b in verdict.breaches]
    assert all(b.after is not None and b.after.index == fault_index for b in verdict.breaches)
    assert f"fault {fault_index} (" in str(verdict.breaches[0])


def test_audit_problems_and_a_lost_reward_are_breaches(history: list[Event]) -> None:
    facts = dataclasses.replace(FACTS, audit_problems=[("hash_chain", 3, "hash mismatch")],
                                final_reward=0.30, baseline_reward=0.60, reward_tolerance=0.1)

    verdict = check_history(history, facts)

    assert {b.check for b in verdict.breaches} == {"audit", "learning"}
    audit = next(b for b in verdict.breaches if b.check == "audit")
    assert audit.after is None and "before any fault" in str(audit)


def test_a_lost_reward_names_the_fault_before_the_fall_not_the_last_fault(
        history: list[Event]) -> None:
    """The reward fell at step 3, after fault 0 (step 2); fault 1 (step 4) came later."""
    facts = dataclasses.replace(FACTS, final_reward=0.10, baseline_reward=0.60,
                                reward_tolerance=0.1, rewards=[0.6, 0.6, 0.1, 0.1, 0.1, 0.1])

    verdict = check_history(history, facts)

    assert [b.check for b in verdict.breaches] == ["learning"]
    learning = verdict.breaches[0]
    assert ("fell below 0.500 at step 3, and its 5-step mean stayed below from step 3"
            in learning.message)
    assert learning.after is not None and learning.after.index == 0
    batch_of_step_3 = next(e for e in history if e.kind == EventKind.BATCH_TRAINED
                           and e.payload["train_step"] == 3)
    assert learning.seq == batch_of_step_3.seq


@pytest.mark.parametrize(("rewards", "window", "fell"), [
    ([0.6, 0.6, 0.1, 0.1, 0.1, 0.1], 5, 3),  # means 0.6, 0.6, 0.43, 0.35, 0.30, 0.20
    ([0.7, 0.7, 0.7, 0.7, 0.1, 0.1], 5, 6),  # means ... 0.7, 0.58, 0.46: only the last
    ([0.1, 0.1, 0.6, 0.6, 0.6, 0.6], 5, None),  # ends above the bound
    ([0.6, 0.1, 0.6, 0.1, 0.1, 0.1], 1, 4),  # below at step 2, back above at 3, below from 4
    ([], 5, None),
])
def test_fell_below_is_the_start_of_the_last_stretch_under_the_bound(
        rewards: list[float], window: int, fell: int | None) -> None:
    assert fell_below(rewards, 0.5, window) == fell


def test_a_learning_breach_is_placed_where_the_reward_fell_not_where_the_mean_caught_up(
        history: list[Event]) -> None:
    """The 5-step mean crosses the bound at step 6 (means 0.9, 0.9, 0.9, 0.8, 0.74, 0.66), two
    steps after the reward fell (step 4): the breach names fault 0, which came before the fall,
    not fault 1 (at step 4's end), which came after it."""
    facts = dataclasses.replace(FACTS, final_reward=0.50, baseline_reward=0.80,
                                reward_tolerance=0.1, rewards=[0.9, 0.9, 0.9, 0.5, 0.5, 0.5])

    learning = check_history(history, facts).breaches[0]

    assert "fell below 0.700 at step 4, and its 5-step mean stayed below from step 6" in (
        learning.message)
    assert learning.after is not None and learning.after.index == 0


@pytest.mark.parametrize(("rewards", "window", "first"), [
    ([0.7] * 6 + [0.1] * 4, 5, 7),  # the mean crosses at step 8; the fall began at 7
    ([0.1] * 10, 5, 1),
    ([0.7] * 6 + [0.4, 0.1, 0.1, 0.1], 2, 7),  # looks back at most window - 1 steps
])
def test_first_low_step_is_where_the_fall_began_within_the_window(
        rewards: list[float], window: int, first: int) -> None:
    fell = fell_below(rewards, 0.5, window)
    assert fell is not None
    assert first_low_step(rewards, 0.5, fell, window) == first


def test_a_run_past_its_deadline_is_a_liveness_breach(history: list[Event]) -> None:
    verdict = check_history(history, dataclasses.replace(FACTS, deadline_s=1.0, elapsed_s=30.0))

    assert [b.check for b in verdict.breaches] == ["liveness"]
    assert "deadline" in verdict.breaches[0].message


def test_the_schedule_is_seeded_poisson_spaced_and_replays_from_its_record() -> None:
    first = draw_schedule(7, 200, mean_interval=10.0)

    assert first == draw_schedule(7, 200, mean_interval=10.0)
    assert first != draw_schedule(8, 200, mean_interval=10.0)
    assert 10 <= len(first) <= 30  # about 200 / 10 faults
    assert all(2 <= f.step < 197 for f in first)
    assert all(b.step - a.step >= 3 for a, b in zip(first, first[1:]))  # no overlap by default
    assert len({f.kind for f in first}) >= 6
    assert schedule_from_payload([f.to_payload() for f in first]) == first


def test_overlap_plans_close_faults_into_the_recovery_of_the_one_before() -> None:
    kinds = [k for k in FaultKind if k is not FaultKind.KILL_NODE]
    overlapping = draw_schedule(3, 400, mean_interval=2.0, kinds=kinds, overlap=True)
    spaced = draw_schedule(3, 400, mean_interval=2.0, kinds=kinds)

    chained = [(a, b) for a, b in zip(overlapping, overlapping[1:]) if b.after is not None]
    assert len(chained) >= len(overlapping) // 4  # about 1 - exp(-3 / 2) of the gaps
    assert all(b.after == a.index and b.step == a.step for a, b in chained)
    assert all(b.step - a.step >= 3 for a, b in zip(overlapping, overlapping[1:])
               if b.after is None)  # the rest are spaced as without overlap
    assert all(fault.after is None for fault in spaced)
    assert FaultKind.KILL_NODE not in {f.kind for f in overlapping}
    assert schedule_from_payload([f.to_payload() for f in overlapping]) == overlapping


@pytest.mark.parametrize("arguments, message", [
    ({"kinds": []}, "every fault kind is excluded"),
    ({"mean_interval": 0}, "--mean-interval must be positive"),
    ({"steps": 4}, "leaves no step for a fault"),
])
def test_a_schedule_that_cannot_be_drawn_says_why(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        draw_schedule(1, **{"steps": 200, **arguments})


def test_an_unknown_fault_kind_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'kill-moon'.*kill-engine"):
        FaultKind.parse(["kill-engine", "kill-moon"])
