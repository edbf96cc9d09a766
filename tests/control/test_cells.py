"""The supervisor and the publisher on a real Ray cluster: frozen cells, zombie publishers,
retried steps, healing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import ray

from actors.errors import CollectiveError, StaleEpochError
from actors.train_cell import TrainCell
from actors.task import AdditionTask
from ledger import EventKind, FencedError, Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control import launch
from orchestrator.errors import EngineLostError, StepFailedError
from orchestrator.control.publisher import Publisher
from orchestrator.control.supervision import Supervisor
from orchestrator.control.supervision import cell_group
from orchestrator.control.supervision.cell_group import SENT_HEARTBEAT_MAX_AGE_S
from orchestrator.drills.faults import zombie_commit, zombie_transfer

pytestmark = pytest.mark.usefixtures("ray_cluster")

RUN = "cells"
HEARTBEAT_S = 2.0


@pytest.fixture
def config() -> RunConfig:
    return RunConfig(run_id=RUN, num_cells=2, num_engines=2, rollout_batch_size=4,
                     n_samples_per_prompt=4, heartbeat_timeout_s=HEARTBEAT_S)


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    with Ledger.open(sqlite_url) as opened:
        opened.start_run(RUN)
        yield opened


@pytest.fixture
def engines(config: RunConfig) -> Iterator[list]:
    handles = [launch.create_engine(config, f"engine-{i}") for i in range(config.num_engines)]
    ray.get([h.health.remote() for h in handles])
    yield handles
    for handle in handles:
        ray.kill(handle)


@pytest.fixture
def supervisor(config: RunConfig, ledger: Ledger, sqlite_url: str, engines: list,
               tmp_path) -> Iterator[Supervisor]:
    bound = config.model_copy(update={"db": sqlite_url})
    supervisor = Supervisor(bound, ledger, RunLayout(tmp_path))
    supervisor.engines = {f"engine-{i}": handle for i, handle in enumerate(engines)}
    supervisor.start_cells()
    supervisor.ensure_publisher(reason="start")
    yield supervisor
    supervisor.cells.stop()


@pytest.fixture
def publisher(supervisor: Supervisor) -> Publisher:
    return Publisher.of(supervisor)


def pid_of(supervisor: Supervisor, cell_id: str) -> int:
    return ray.get(supervisor.cells.actor(cell_id).pid.remote())


def batch(engines: list, size: int = 4) -> list:
    task = AdditionTask(seed=0)
    return ray.get([
        engines[i % len(engines)].generate.remote(task.make_prompt(i), 4, i) for i in range(size)
    ])


def engine_view(engines: list) -> list[tuple]:
    health = ray.get([e.health.remote() for e in engines])
    checksums = ray.get([e.weights_checksum.remote() for e in engines])
    return [(h["version"], h["epoch"], c) for h, c in zip(health, checksums)]


def test_zombie_publisher_is_fenced_by_ledger_and_engines(supervisor, publisher, ledger,
                                                          engines):
    assert publisher.publish_weights().version == 1
    zombie = supervisor.cells.actor("cell-0")
    zombie_pid = pid_of(supervisor, "cell-0")

    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        assert supervisor.check_cells() == ["cell-0"]
        _, new_epoch = supervisor.ensure_publisher()
        assert (ledger.head(RUN).publisher_cell, new_epoch) == ("cell-1", 2)
        assert publisher.publish_weights().version == 2
    finally:
        os.kill(zombie_pid, signal.SIGCONT)
    head_before, engines_before = ledger.head(RUN), engine_view(engines)

    # Its update replays the weight_update_started it already recorded for this train step
    # (idempotent: the stored event comes back), then the engines refuse epoch 1.
    with pytest.raises(StaleEpochError):
        ray.get(zombie.update_weights.remote(engines, 1))
    # The sequence's own commit step, and its stage-and-load steps, run inside the zombie.
    with pytest.raises(FencedError):
        ray.get(zombie.__ray_call__.remote(zombie_commit, 1))
    with pytest.raises(StaleEpochError):
        ray.get(zombie.__ray_call__.remote(zombie_transfer, engines, 1))

    assert ledger.head(RUN) == head_before
    assert engine_view(engines) == engines_before
    assert {version for version, _, _ in engines_before} == {2}
    report = ledger.verify(RUN)
    assert report.ok, report.problems


def test_a_step_stalled_by_a_frozen_cell_is_retried_on_the_survivor_once(
    supervisor, publisher, ledger, engines
):
    frozen_pid = pid_of(supervisor, "cell-0")
    os.kill(frozen_pid, signal.SIGSTOP)
    try:
        metrics = supervisor.train_step(batch(engines))
    finally:
        os.kill(frozen_pid, signal.SIGKILL)

    assert supervisor.counters.retried_steps >= 1
    assert supervisor.cells.alive_ids() == ["cell-1"]
    assert metrics["cells_in_step"] == 1.0
    assert ray.get(supervisor.cells.actor("cell-1").progress.remote()) == 1  # exactly once
    head = ledger.head(RUN)
    assert (head.publisher_cell, head.epoch) == ("cell-1", 2)
    assert publisher.publish_weights().version == 1


def test_the_step_boundary_heartbeat_gives_the_next_train_attempt_its_counts(
    supervisor, engines
):
    """The heartbeat's answers are the cells' optimizer-step counts; the next train attempt
    takes them once instead of asking again, and any change of a cell's state voids them."""
    cells = supervisor.cells
    alive = cells.alive_ids()
    supervisor.train_step(batch(engines))

    supervisor.check_cells()  # the boundary heartbeat (Supervisor.begin_step)
    assert cells.take_heartbeat_progress(alive) == {"cell-0": 1, "cell-1": 1}
    assert cells.take_heartbeat_progress(alive) is None  # taken once
    supervisor.check_cells()
    assert cells.take_heartbeat_progress(["cell-0"]) is None  # heard other cells

    supervisor.check_cells()
    cells.copy_state("cell-0", ["cell-1"])  # state changed since the heartbeat
    assert cells.take_heartbeat_progress(alive) is None
    supervisor.check_cells()
    supervisor.train_step(batch(engines))  # took the heartbeat's counts: none left over
    assert cells.take_heartbeat_progress(alive) is None
    assert ray.get([cells.actor(c).progress.remote() for c in alive]) == [2, 2]


def test_a_healed_cell_rejoins_with_the_survivors_state(supervisor, ledger, engines):
    supervisor.train_step(batch(engines))
    os.kill(pid_of(supervisor, "cell-1"), signal.SIGKILL)
    assert supervisor.check_cells() == ["cell-1"]

    assert supervisor.heal_lost_cells() == ["cell-1"]
    supervisor.train_step(batch(engines))

    cells = supervisor.cells
    checksums = ray.get([cells.actor(c).weights_checksum.remote() for c in ("cell-0", "cell-1")])
    progress = ray.get([cells.actor(c).progress.remote() for c in ("cell-0", "cell-1")])
    assert checksums[0] == checksums[1]
    assert progress == [2, 2]
    states = [(e.cell_id, e.payload["state"]) for e in ledger.events(RUN) if e.kind == "cell_state"]
    assert ("cell-1", "errored") in states and ("cell-1", "healed") in states
    assert ledger.head(RUN).publisher_cell == "cell-0"  # a follower died: no promotion


def test_an_engine_dying_before_the_commit_is_not_blamed_on_the_publisher(
    supervisor, publisher, ledger, engines
):
    os.kill(ray.get(engines[1].pid.remote()), signal.SIGKILL)
    head_before = ledger.head(RUN)

    with pytest.raises(EngineLostError):
        publisher.try_publish()

    assert supervisor.cells.alive_ids() == ["cell-0", "cell-1"]
    head = ledger.head(RUN)
    assert (head.version, head.epoch, head.publisher_cell) == (0, 1, "cell-0")
    assert head.seq > head_before.seq  # weight_update_started/aborted are on record
    aborted = [e for e in ledger.events(RUN) if e.kind == "weight_update_aborted"]
    assert len(aborted) == 1 and aborted[0].cell_id == "cell-0"


class NoCollectiveCell(TrainCell):
    """A real cell on a machine whose collective backend is broken: every join fails."""

    def configure_group(self, *args, **kwargs) -> None:
        raise CollectiveError(f"cell {self.cell_id}: no collective backend here")


def create_cell_without_collectives(config: RunConfig, cell_id: str):
    return ray.remote(num_cpus=launch.CELL_CPUS)(NoCollectiveCell).remote(
        cell_id, config.backend, launch.policy_config(config), seed=config.seed
    )


def test_a_quorum_that_never_forms_fails_instead_of_retrying_for_ever(config, ledger,
                                                                      sqlite_url, tmp_path):
    bound = config.model_copy(update={"db": sqlite_url})
    supervisor = Supervisor(bound, ledger, RunLayout(tmp_path),
                            create_cell=create_cell_without_collectives)
    try:
        with pytest.raises(StepFailedError, match="could not be formed"):
            supervisor.start_cells()
        # nobody was wrongly declared dead
        assert supervisor.cells.alive_ids() == ["cell-0", "cell-1"]
        assert supervisor.cells.quorum_id == supervisor.policy.max_attempts
    finally:
        supervisor.cells.stop()


def test_a_heartbeat_sent_ahead_is_not_read_after_a_long_drain(supervisor, engines):
    """The loop sends the boundary heartbeat before a drain; after a drain longer than its
    answers may stand, the cells are asked again, so a cell lost meanwhile is seen lost."""
    cells = supervisor.cells
    supervisor.send_heartbeat()
    time.sleep(SENT_HEARTBEAT_MAX_AGE_S + 0.25)  # answered (alive), then too old
    os.kill(ray.get(cells.actor("cell-1").pid.remote()), signal.SIGKILL)

    assert supervisor.check_cells() == ["cell-1"]
    assert cells.alive_ids() == ["cell-0"]


def test_a_heartbeat_sent_ahead_is_void_once_a_cells_state_changes(
        supervisor, engines, monkeypatch):
    cells = supervisor.cells
    monkeypatch.setattr(cell_group, "SENT_HEARTBEAT_MAX_AGE_S", 60.0)  # never too old here
    supervisor.train_step(batch(engines))
    supervisor.send_heartbeat()
    assert supervisor.check_cells() == []  # read: the answers sent for
    assert cells.take_heartbeat_progress(cells.alive_ids()) == {"cell-0": 1, "cell-1": 1}

    supervisor.send_heartbeat()
    time.sleep(0.25)  # answered (alive)
    cells.copy_state("cell-0", ["cell-1"])
    os.kill(ray.get(cells.actor("cell-1").pid.remote()), signal.SIGKILL)

    assert supervisor.check_cells() == ["cell-1"]


def test_a_publish_finished_in_the_background_is_settled_before_the_engines_are_read(
        supervisor, ledger, engines):
    """The training job's publisher: each update returns once committed, the publisher cell
    stamps the engines on its tail, and ``settle`` waits for it; the next update settles it
    first, so every version's engines_stamped comes before the next one starts."""
    publisher = Publisher.of(supervisor, finish_in_background=True)

    first = publisher.publish_weights()
    publisher.settle()

    assert first.version == 1 and "stamp" not in first.step_seconds
    publishing_cell = supervisor.cells.actor(first.publisher_cell)
    assert ray.get(publishing_cell.settle_update.remote()) is None  # settled by the publisher
    assert {version for version, _, _ in engine_view(engines)} == {1}
    stamped = list(ledger.events(RUN))[-1]
    assert stamped.kind == EventKind.ENGINES_STAMPED
    assert sorted(stamped.payload["engine_ids"]) == ["engine-0", "engine-1"]

    supervisor.train_step(batch(engines))  # the cells train while nothing is pending
    second = publisher.publish_weights()  # not settled here: the next update does it
    supervisor.train_step(batch(engines))  # the publisher trains beside its tail
    third = publisher.publish_weights()
    publisher.settle()

    assert (second.version, third.version) == (2, 3) and "tail_wait" in third.step_seconds
    order = [(event.kind, event.version or event.payload.get("version"))
             for event in ledger.events(RUN)
             if event.kind in (EventKind.WEIGHT_COMMITTED, EventKind.ENGINES_STAMPED)]
    assert order == [(kind, version) for version in (1, 2, 3)
                     for kind in (EventKind.WEIGHT_COMMITTED, EventKind.ENGINES_STAMPED)]
    assert {version for version, _, _ in engine_view(engines)} == {3}
    report = ledger.verify(RUN)
    assert report.ok and report.unstamped_versions == []
