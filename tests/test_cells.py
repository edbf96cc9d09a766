"""CellGroup on a real Ray cluster: frozen cells, zombie publishers, retried steps, healing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import ray

from actors.errors import CollectiveError, StaleEpochError
from actors.train_cell import TrainCell
from actors.task import AdditionTask
from ledger import FencedError, Ledger
from orchestrator.control import launch
from orchestrator.control.cells import CellGroup, StepFailedError
from orchestrator.config import RunConfig

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
def cells(config: RunConfig, ledger: Ledger, sqlite_url: str) -> Iterator[CellGroup]:
    group = CellGroup(config, ledger, sqlite_url, RUN, launch.create_cell)
    group.start()
    group.ensure_publisher(reason="start")
    yield group
    group.stop()


def pid_of(group: CellGroup, cell_id: str) -> int:
    return ray.get(group.actor(cell_id).pid.remote())


def batch(engines: list, size: int = 4) -> list:
    task = AdditionTask(seed=0)
    return ray.get([
        engines[i % len(engines)].generate.remote(task.make_prompt(i), 4, i) for i in range(size)
    ])


def engine_view(engines: list) -> list[tuple]:
    health = ray.get([e.health.remote() for e in engines])
    checksums = ray.get([e.weights_checksum.remote() for e in engines])
    return [(h["version"], h["epoch"], c) for h, c in zip(health, checksums)]


def test_zombie_publisher_is_fenced_by_ledger_and_engines(cells, ledger, engines, sqlite_url):
    assert cells.update_weights(engines) == 1
    zombie = cells.actor("cell-0")
    zombie_pid = pid_of(cells, "cell-0")

    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        assert cells.check_liveness() == ["cell-0"]
        new_epoch = cells.ensure_publisher()
        cells.reform()
        assert (cells.publisher, new_epoch) == ("cell-1", 2)
        assert cells.update_weights(engines) == 2
    finally:
        os.kill(zombie_pid, signal.SIGCONT)
    head_before, engines_before = ledger.head(RUN), engine_view(engines)

    # Its update replays the weight_update_started it already recorded for this train step
    # (idempotent: the stored event comes back), then the engines refuse epoch 1.
    with pytest.raises(StaleEpochError):
        ray.get(zombie.update_weights.remote(engines, 1, sqlite_url, RUN))
    with pytest.raises(FencedError):
        ray.get(zombie.commit.remote(sqlite_url, RUN, 1, "sha256:zombie"))
    with pytest.raises(StaleEpochError):
        ray.get(zombie.transfer.remote(engines, 1))

    assert ledger.head(RUN) == head_before
    assert engine_view(engines) == engines_before
    assert {version for version, _, _ in engines_before} == {2}
    report = ledger.verify(RUN)
    assert report.ok, report.problems


def test_a_step_stalled_by_a_frozen_cell_is_retried_on_the_survivor_once(
    cells, ledger, engines
):
    frozen_pid = pid_of(cells, "cell-0")
    os.kill(frozen_pid, signal.SIGSTOP)
    try:
        metrics = cells.train_step(batch(engines))
    finally:
        os.kill(frozen_pid, signal.SIGKILL)

    assert cells.events.retried_steps >= 1
    assert cells.alive_ids() == ["cell-1"]
    assert metrics["cells_in_step"] == 1.0
    assert ray.get(cells.actor("cell-1").progress.remote()) == 1  # applied exactly once
    head = ledger.head(RUN)
    assert (head.publisher_cell, head.epoch) == ("cell-1", 2)
    assert cells.update_weights(engines) == 1


def test_a_healed_cell_rejoins_with_the_survivors_state(cells, ledger, engines):
    cells.train_step(batch(engines))
    os.kill(pid_of(cells, "cell-1"), signal.SIGKILL)
    assert cells.check_liveness() == ["cell-1"]

    cells.heal("cell-1")
    cells.train_step(batch(engines))

    checksums = ray.get([cells.actor(c).weights_checksum.remote() for c in ("cell-0", "cell-1")])
    progress = ray.get([cells.actor(c).progress.remote() for c in ("cell-0", "cell-1")])
    assert checksums[0] == checksums[1]
    assert progress == [2, 2]
    states = [(e.cell_id, e.payload["state"]) for e in ledger.events(RUN) if e.kind == "cell_state"]
    assert ("cell-1", "errored") in states and ("cell-1", "healed") in states
    assert ledger.head(RUN).publisher_cell == "cell-0"  # a follower died: no promotion


def test_an_engine_dying_before_the_commit_is_not_blamed_on_the_publisher(
    cells, ledger, engines
):
    from orchestrator.control.cells import EngineLostError

    os.kill(ray.get(engines[1].pid.remote()), signal.SIGKILL)
    head_before = ledger.head(RUN)

    with pytest.raises(EngineLostError):
        cells.update_weights(engines)

    assert cells.alive_ids() == ["cell-0", "cell-1"]
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
                                                                      sqlite_url):
    group = CellGroup(config, ledger, sqlite_url, RUN, create_cell_without_collectives)
    try:
        with pytest.raises(StepFailedError, match="could not be formed"):
            group.start()
        assert group.alive_ids() == ["cell-0", "cell-1"]  # nobody was wrongly declared dead
        assert group.quorum_id == group.max_attempts
    finally:
        group.stop()
