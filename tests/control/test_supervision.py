"""The supervision facade on a real Ray cluster: the step boundary, a frozen engine replaced,
the rollout manager replaced mid-drain (killed or frozen) from the ledger's prompt account,
every cell lost at once and restarted from a checkpoint, and the publisher handing restarted
engines over with explicit collaborators."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator

import pytest
import ray

from ledger import EventKind, Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control.provenance_recorder import ProvenanceRecorder
from orchestrator.control.publisher import Publisher
from orchestrator.control.supervision import FailurePolicy, Supervisor
from orchestrator.drills.faults import actor_pid
from orchestrator.errors import NoCellAliveError
from orchestrator.metric_keys import metric_key

pytestmark = pytest.mark.usefixtures("ray_cluster")

RUN = "supervised"
# Short bounds, so a frozen engine is declared dead in seconds (a node probe needs a few).
POLICY = FailurePolicy(heartbeat_timeout_s=5.0, step_grace_s=1.0, probe_grace_s=1.0)


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    with Ledger.open(sqlite_url) as opened:
        opened.start_run(RUN)
        yield opened


@contextlib.contextmanager
def started(ledger: Ledger, sqlite_url: str, tmp_path, policy: FailurePolicy = POLICY
            ) -> Iterator[Supervisor]:
    config = RunConfig(run_id=RUN, db=sqlite_url, num_cells=2, num_engines=2,
                       rollout_batch_size=4, n_samples_per_prompt=4,
                       heartbeat_timeout_s=policy.heartbeat_timeout_s)
    supervisor = Supervisor(config, ledger, RunLayout(tmp_path), policy=policy)
    supervisor.start_engines()
    supervisor.start_cells()
    supervisor.ensure_publisher(reason="start")
    supervisor.start_manager()
    try:
        yield supervisor
    finally:
        supervisor.stop()


@pytest.fixture
def supervisor(ledger: Ledger, sqlite_url: str, tmp_path) -> Iterator[Supervisor]:
    with started(ledger, sqlite_url, tmp_path) as running:
        yield running


@contextlib.contextmanager
def frozen(actor) -> Iterator[int]:
    """SIGSTOP the actor's process for the block (SIGCONT after, if it still exists)."""
    pid = actor_pid(actor)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def drain(supervisor: Supervisor, step: int):
    return supervisor.await_drain(supervisor.request_drain(step))


def replacements(ledger: Ledger) -> list[tuple[str, str, str]]:
    """The run's ``actor_replaced`` events: (actor, id, reason)."""
    return [(e.payload["actor"], e.payload["actor_id"], e.payload["reason"])
            for e in ledger.events(RUN) if e.kind == EventKind.ACTOR_REPLACED]


def test_a_frozen_engine_is_replaced_at_the_step_boundary_and_gets_the_next_update(
    supervisor: Supervisor, ledger: Ledger,
):
    publisher = Publisher.of(supervisor)
    assert publisher.publish_weights().version == 1
    batch = drain(supervisor, 0)
    old = supervisor.engines["engine-0"]

    with frozen(old):
        supervisor.begin_step(batch)  # the probe reaches a stopped process
        metrics = supervisor.train_step(batch.samples)  # a probe timeout counts as a death

    assert "loss" in metrics
    assert supervisor.counters.engine_restarts == 1
    assert replacements(ledger) == [("engine", "engine-0", "frozen")]
    assert supervisor.engines["engine-0"] is not old
    assert supervisor.engines_awaiting_weights  # the loop must publish now
    assert publisher.publish_weights().version == 2
    assert not supervisor.engines_awaiting_weights  # handed over to the manager
    assert ray.get(supervisor.engines["engine-0"].health.remote())["version"] == 2
    assert supervisor.end_step() == []  # no cell was lost
    supervisor.settle_version_push()  # the manager took v2 (end_step does not wait for it)
    assert ray.get(supervisor.manager.get_weight_version.remote()) == 2


def test_a_restarted_engine_is_handed_over_only_once_its_update_tail_has_stamped_it(
    supervisor: Supervisor, ledger: Ledger,
):
    """The training job's publisher finishes updates in the background (steps 5-6 on the
    publisher cell's tail). A restarted engine must not serve the manager before the tail
    stamps it, so ``publish_weights`` settles the tail before the hand-over: here the tail
    is held ``DELAY_S`` before ``engines_stamped``, and the publish still returns with it
    recorded."""
    publisher = Publisher.of(supervisor, finish_in_background=True)
    assert publisher.publish_weights().version == 1
    batch = drain(supervisor, 0)
    old = supervisor.engines["engine-0"]
    with frozen(old):
        supervisor.begin_step(batch)
        supervisor.train_step(batch.samples)
    assert supervisor.engines_awaiting_weights
    publishing_cell = supervisor.cells.actor(ledger.head(RUN).publisher_cell)
    ray.get(publishing_cell.arm_update_fault.remote("after-finalize", "delay"))

    second = publisher.publish_weights()

    assert not supervisor.engines_awaiting_weights
    stamped = [e.payload for e in ledger.events(RUN) if e.kind == EventKind.ENGINES_STAMPED]
    assert stamped[-1]["version"] == second.version == 2
    assert sorted(stamped[-1]["engine_ids"]) == ["engine-0", "engine-1"]
    assert ray.get(supervisor.engines["engine-0"].health.remote())["version"] == 2
    assert supervisor.end_step() == []


def test_an_engine_frozen_before_a_weight_update_is_replaced_and_the_update_published(
    supervisor: Supervisor, ledger: Ledger,
):
    """Chaos seed 11: an engine SIGSTOPped just before an update never answers the pause.
    The publisher cell stops waiting at the policy's engine deadline and reports the engine
    lost (not itself silent): the engine is probed and replaced, the update is retried, and
    the publisher keeps its cell and epoch (no failover)."""
    publisher = Publisher.of(supervisor)
    first = publisher.publish_weights()
    batch = drain(supervisor, 0)
    supervisor.begin_step(batch)
    supervisor.train_step(batch.samples)  # new weights to publish
    supervisor.end_step()
    old = supervisor.engines["engine-1"]

    with frozen(old):
        second = publisher.publish_weights()

    assert second.version == first.version + 1
    assert (second.publisher_cell, second.epoch) == (first.publisher_cell, first.epoch)
    assert supervisor.counters.engine_restarts == 1
    assert replacements(ledger) == [("engine", "engine-1", "frozen")]
    aborted = [e.payload["reason"] for e in ledger.events(RUN)
               if e.kind == EventKind.WEIGHT_UPDATE_ABORTED]
    assert len(aborted) == 1 and "EngineSilentError" in aborted[0], aborted
    for engine_id, engine in supervisor.engines.items():
        assert ray.get(engine.health.remote())["version"] == second.version, engine_id


def test_a_killed_follower_is_failed_over_at_begin_step_and_healed_at_end_step(
    supervisor: Supervisor, ledger: Ledger,
):
    batch = drain(supervisor, 0)
    os.kill(ray.get(supervisor.cells.actor("cell-1").pid.remote()), signal.SIGKILL)

    supervisor.begin_step(batch)
    assert supervisor.cells.alive_ids() == ["cell-0"]
    supervisor.train_step(batch.samples)
    assert supervisor.end_step() == ["cell-1"]

    assert supervisor.cells.alive_ids() == ["cell-0", "cell-1"]
    assert supervisor.counters.heals == 1
    assert ledger.head(RUN).publisher_cell == "cell-0"  # a follower died: no promotion


def test_a_frozen_manager_is_probed_at_a_drain_and_replaced(ledger: Ledger, sqlite_url: str,
                                                             tmp_path):
    """A SIGSTOPped manager never answers a drain: after the manager call timeout without a
    batch it is probed (bounded by the probe timeout, not a second call timeout), found
    silent, and replaced; the drain is asked again."""
    policy = dataclasses.replace(POLICY, manager_call_timeout_s=8.0, manager_probe_timeout_s=2.0)
    with started(ledger, sqlite_url, tmp_path, policy) as supervisor:
        drain(supervisor, 0)
        old = supervisor.manager
        watch = supervisor.manager_watch
        probes: list[float | None] = []
        probe = watch.alive

        def recorded_probe(timeout: float | None = None) -> bool:
            probes.append(timeout)
            return probe(timeout)

        watch.alive = recorded_probe  # the real probe, its bound recorded

        with frozen(old):
            batch = drain(supervisor, 1)

        assert probes == [2.0]
        assert supervisor.counters.manager_replacements == 1
        assert replacements(ledger) == [("rollout-manager", "rollout-manager", "frozen")]
        assert supervisor.manager is not old
        assert len(batch.samples) == 4
        assert ray.get(supervisor.manager.get_weight_version.remote(), timeout=30) == 0


def test_a_manager_lost_at_a_drain_is_replaced_from_the_ledgers_prompt_account(
    supervisor: Supervisor, ledger: Ledger,
):
    """The manager dies before the next drain is asked of it: the drain finds it dead, a
    replacement is rebuilt from the ledger and asked again. (Killing it after the request
    raced the drain itself: on an idle machine the batch was often ready before the kill,
    and nothing was replaced.)"""
    first = drain(supervisor, 0)
    dropped, next_index = supervisor.call_manager(lambda m: m.provenance_snapshot.remote())
    ProvenanceRecorder(ledger, RUN).record(
        1, first, trainer_version=0, produced_version=None, cells=["cell-0", "cell-1"],
        drain_version=int(first.metrics[metric_key("weight_version")]),
        dropped_prompts=dropped, next_index=next_index, recycled=0)
    trained = {group[0].group_index for group in first.samples}
    held_batch = drain(supervisor, 1)
    supervisor.begin_step(held_batch)  # the driver holds these prompts now
    held = {group[0].group_index for group in held_batch.samples}

    ray.kill(supervisor.manager, no_restart=True)
    replacement_batch = supervisor.await_drain(supervisor.request_drain(2))

    assert supervisor.counters.manager_replacements == 1
    assert replacements(ledger) == [("rollout-manager", "rollout-manager", "dead")]
    assert len(replacement_batch.samples) == 4
    regenerated = {group[0].group_index for group in replacement_batch.samples}
    assert not regenerated & trained  # nothing on record as trained comes back
    assert not regenerated & held  # nor what the driver holds
    states = ray.get(supervisor.manager.prompt_states.remote())
    assert not (trained | held) & {i for i, s in states.items() if s != "trained"}


def test_losing_every_cell_restarts_them_from_the_newest_checkpoint(
    supervisor: Supervisor, ledger: Ledger,
):
    """The chaos campaign of seed 1 (2026-12-02, --overlap): a zombie publisher was failed
    over to the only follower, which was killed before the zombie was healed, and the run
    ended (NoCellAliveError). With no survivor to copy from, every cell is now restarted from
    the newest checkpoint, as a resumed job is, and the step goes on."""
    publisher = Publisher.of(supervisor)
    for step in range(2):
        batch = drain(supervisor, step)
        supervisor.begin_step(batch)
        supervisor.train_step(batch.samples)
        publisher.publish_weights()
        if step == 0:
            publisher.save_checkpoint(supervisor.storage.checkpoint_url(1))
    epoch = ledger.head(RUN).epoch
    batch = drain(supervisor, 2)
    supervisor.begin_step(batch)
    for cell_id in ("cell-0", "cell-1"):
        os.kill(actor_pid(supervisor.cells.actor(cell_id)), signal.SIGKILL)

    metrics = supervisor.train_step(batch.samples)

    assert "loss" in metrics
    assert supervisor.counters.checkpoint_restores == 1
    assert supervisor.cells.alive_ids() == ["cell-0", "cell-1"]
    counts, failed = supervisor.cells.progress(["cell-0", "cell-1"])
    assert not failed and counts == {"cell-0": 2, "cell-1": 2}  # checkpoint's 1, then this one
    head = ledger.head(RUN)
    assert head.epoch == epoch + 1  # whatever is left of the old publisher is fenced
    healed = [e.cell_id for e in ledger.events(RUN)
              if e.kind == EventKind.CELL_STATE and e.payload["state"] == "healed"]
    assert sorted(healed) == ["cell-0", "cell-1"]
    assert publisher.publish_weights().version == head.version + 1


def test_three_faults_in_one_weight_update_are_each_recovered_and_the_update_lands(
    supervisor: Supervisor, ledger: Ledger,
):
    """Chaos seed 14 (2026-12-02, --overlap): the publisher killed after its commit, the new
    publisher killed mid-transfer, then an engine killed, all in one update. Each failure was
    recovered (failover, a restore from the checkpoint, a replacement), yet the three used up
    the update's attempts and the run ended. Recovered failures no longer count."""
    publisher = Publisher.of(supervisor)
    batch = drain(supervisor, 0)
    supervisor.begin_step(batch)
    supervisor.train_step(batch.samples)
    publisher.publish_weights()
    publisher.save_checkpoint(supervisor.storage.checkpoint_url(1))
    batch = drain(supervisor, 1)
    supervisor.begin_step(batch)
    supervisor.train_step(batch.samples)
    head = ledger.head(RUN)

    def kill(actor) -> None:
        os.kill(actor_pid(actor), signal.SIGKILL)

    faults = [lambda: kill(supervisor.cells.actor(head.publisher_cell)),
              lambda: kill(supervisor.cells.actor(supervisor.cells.alive_ids()[0])),
              lambda: kill(supervisor.engines["engine-0"])]

    def before_publish() -> None:  # before each attempt, as the campaign's chained faults
        if faults:
            faults.pop(0)()

    outcome = Publisher.of(supervisor, before_publish=before_publish).publish_weights()

    assert not faults
    assert outcome.version == head.version + 1
    assert supervisor.counters.checkpoint_restores == 1
    assert replacements(ledger) == [("engine", "engine-0", "dead")]
    assert ledger.head(RUN).epoch > head.epoch


def test_losing_every_cell_before_any_checkpoint_ends_the_step_with_a_typed_error(
    supervisor: Supervisor,
):
    batch = drain(supervisor, 0)
    supervisor.begin_step(batch)
    for cell_id in ("cell-0", "cell-1"):
        os.kill(actor_pid(supervisor.cells.actor(cell_id)), signal.SIGKILL)

    with pytest.raises(NoCellAliveError, match="no checkpoint to restore them from"):
        supervisor.train_step(batch.samples)


def test_an_update_does_not_wait_for_a_frozen_manager_and_the_next_push_replaces_it(
        ledger: Ledger, sqlite_url: str, tmp_path):
    """The version push is sent, not awaited: a publish completes while the manager is
    stopped, the step boundary leaves the unanswered push pending, and the next push, which
    checks it first, replaces the silent manager; the replacement starts at the ledger head,
    the version just published."""
    policy = dataclasses.replace(POLICY, manager_call_timeout_s=8.0)
    with started(ledger, sqlite_url, tmp_path, policy) as supervisor:
        publisher = Publisher.of(supervisor)
        old = supervisor.manager

        with frozen(old):
            assert publisher.publish_weights().version == 1
            supervisor.end_step()  # the answer is not in: pending, no wait
            assert supervisor.counters.manager_replacements == 0
            publisher.publish_weights()  # nothing trained since: v1 again, pushed again

        assert supervisor.counters.manager_replacements == 1
        assert replacements(ledger) == [("rollout-manager", "rollout-manager", "frozen")]
        assert ray.get(supervisor.manager.get_weight_version.remote(), timeout=30) == 1


def test_the_end_of_training_waits_for_a_frozen_managers_answer_and_replaces_it(
        ledger: Ledger, sqlite_url: str, tmp_path):
    """The last step's push has no next push to check it: the end of training does."""
    policy = dataclasses.replace(POLICY, manager_call_timeout_s=8.0)
    with started(ledger, sqlite_url, tmp_path, policy) as supervisor:
        with frozen(supervisor.manager):
            assert Publisher.of(supervisor).publish_weights().version == 1
            supervisor.end_step()
            supervisor.settle_version_push()

        assert supervisor.counters.manager_replacements == 1
        assert ray.get(supervisor.manager.get_weight_version.remote(), timeout=30) == 1


def test_a_version_push_the_manager_refuses_fails_the_boundary_that_sees_the_answer(
        supervisor: Supervisor):
    supervisor.manager_watch.push_version(7)  # nobody committed version 7

    deadline = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayTaskError, match="VersionAheadOfLedger"):
        while time.monotonic() < deadline:  # each boundary looks; the one that sees it raises
            supervisor.end_step()
            time.sleep(0.05)
    assert ray.get(supervisor.manager.get_weight_version.remote()) == 0

    supervisor.manager_watch.push_version(8)
    with pytest.raises(ray.exceptions.RayTaskError, match="VersionAheadOfLedger"):
        supervisor.settle_version_push()
