"""TrainCell: publisher deaths at the two critical points of DESIGN section 5, gradient
averaging across cells, healing state and checkpoints.

Fault schedule (declared up front; each test asserts the kill really happened):
- ``kill(cell-0, at=UpdatePoint.AFTER_TRANSFER)``: transferred, not committed
- ``kill(cell-0, at=UpdatePoint.AFTER_COMMIT)``: committed, not stamped
The point is armed on the cell, the cell's own ``update_weights`` (the production sequence)
runs into it and freezes there, and the test sends a real SIGKILL to the frozen worker.
"""

from __future__ import annotations

import os
import signal

import pytest
import ray
import torch
from ray.exceptions import RayActorError

from actors.errors import CollectiveError
from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.gradient_group import create_rendezvous_store
from actors.train_cell import TRAIN_CELL_ACTOR_OPTIONS, TrainCell, has_learning_signal
from actors.publishing.sequence import UpdatePoint
from ledger import FencedError, Ledger
from orchestrator.drills.faults import wait_stopped

TASK = AdditionTask(seed=0)
CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
RUN = "cells"


def _batch(engine, start: int, prompts: int = 8):
    if isinstance(engine, RolloutEngine):
        return [engine.generate(TASK.make_prompt(i), 8, i) for i in range(start, start + prompts)]
    return ray.get([engine.generate.remote(TASK.make_prompt(i), 8, i)
                    for i in range(start, start + prompts)])


def _kill(actor) -> None:
    """SIGKILL the actor's worker process and wait until Ray reports it dead."""
    os.kill(ray.get(actor.pid.remote()), signal.SIGKILL)
    with pytest.raises(RayActorError):
        ray.get(actor.pid.remote(), timeout=30)


def _update_killed_at(cell, point: UpdatePoint, engines, epoch: int) -> None:
    """Arm ``point`` on ``cell``, run its update into it, SIGKILL it there; the update and
    the cell are reported dead."""
    pid = ray.get(cell.pid.remote())
    assert ray.get(cell.arm_update_fault.remote(point)) == {str(point): "stop"}
    update = cell.update_weights.remote(engines, epoch)
    assert wait_stopped(pid, timeout_s=60), f"the update never reached {point}"
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RayActorError):
        ray.get(update, timeout=30)
    with pytest.raises(RayActorError):
        ray.get(cell.pid.remote(), timeout=30)


@pytest.fixture
def publisher_setup(ray_cluster, sqlite_url: str):
    """Two cells (cell-0 trained one step, so its weights are new), two engines, a ledger
    with cell-0 promoted."""
    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
    Cell = ray.remote(**TRAIN_CELL_ACTOR_OPTIONS)(TrainCell)
    engines = [Engine.remote(f"engine-{i}", "torch", CONFIG, 0, TASK) for i in range(2)]
    cells = [Cell.remote(f"cell-{i}", "torch", CONFIG, 0, ledger_url=sqlite_url, run_id=RUN)
             for i in range(2)]
    # A batch whose rewards are all equal has no learning signal and changes nothing: train
    # until cell-0's weights differ from the engines' (sampling decides how many batches).
    launched = ray.get(cells[0].weights_checksum.remote())
    for start in range(0, 64, 8):
        ray.get(cells[0].train_step.remote(_batch(engines[0], start)))
        if ray.get(cells[0].weights_checksum.remote()) != launched:
            break
    ledger = Ledger.open(sqlite_url)
    ledger.start_run(RUN)
    epoch = ledger.promote(RUN, "cell-0", reason="start")
    yield ledger, epoch, cells, engines
    for actor in (*cells, *engines):
        ray.kill(actor)
    ledger.close()


@pytest.mark.ray
def test_publisher_killed_after_transfer_before_commit(publisher_setup, sqlite_url: str) -> None:
    ledger, epoch, cells, engines = publisher_setup
    initial = ray.get(engines[0].weights_checksum.remote())
    transferred = ray.get(cells[0].weights_checksum.remote())  # what a full update sends

    _update_killed_at(cells[0], UpdatePoint.AFTER_TRANSFER, engines, epoch)

    health = ray.get([e.health.remote() for e in engines])
    assert transferred != initial
    assert [(h["paused"], h["version"]) for h in health] == [(True, 0)] * 2  # paused, label old
    assert ray.get([e.weights_checksum.remote() for e in engines]) == [transferred] * 2
    assert ledger.head(RUN).version == 0
    assert not any(e.kind == "weight_committed" for e in ledger.events(RUN))

    next_epoch = ledger.promote(RUN, "cell-1", reason="failover", previous_cell="cell-0")
    version = ray.get(cells[1].update_weights.remote(engines, next_epoch)).version

    survivor = ray.get(cells[1].weights_checksum.remote())
    assert version == 1 == ledger.head(RUN).version
    assert [(h["version"], h["epoch"], h["paused"]) for h in
            ray.get([e.health.remote() for e in engines])] == [(1, next_epoch, False)] * 2
    assert ray.get([e.weights_checksum.remote() for e in engines]) == [survivor] * 2
    report = ledger.verify(RUN)
    assert report.ok, report.problems
    assert report.unstamped_versions == []


@pytest.mark.ray
def test_publisher_killed_after_commit_before_stamp(publisher_setup, sqlite_url: str) -> None:
    ledger, epoch, cells, engines = publisher_setup
    _update_killed_at(cells[0], UpdatePoint.AFTER_COMMIT, engines, epoch)

    committed = ledger.head(RUN).version
    report = ledger.verify(RUN)
    assert committed == 1
    assert report.ok, report.problems  # committed-but-unstamped is reported, not an error
    assert report.unstamped_versions == [1]
    assert [h["version"] for h in ray.get([e.health.remote() for e in engines])] == [0, 0]

    next_epoch = ledger.promote(RUN, "cell-1", reason="failover", previous_cell="cell-0")
    version = ray.get(cells[1].update_weights.remote(engines, next_epoch)).version

    report = ledger.verify(RUN)
    assert version == committed + 1 == ledger.head(RUN).version
    assert [h["version"] for h in ray.get([e.health.remote() for e in engines])] == [2, 2]
    assert report.ok, report.problems
    assert report.unstamped_versions == [1]


@pytest.mark.ray
def test_a_superseded_publisher_is_fenced_by_ledger_and_engines(publisher_setup,
                                                                sqlite_url: str) -> None:
    ledger, epoch, cells, engines = publisher_setup
    newer = ledger.promote(RUN, "cell-1", reason="manual", previous_cell="cell-0")
    ray.get(cells[1].update_weights.remote(engines, newer))

    with pytest.raises(FencedError):
        ray.get(cells[0].update_weights.remote(engines, epoch))

    assert ledger.head(RUN).version == 1
    assert [h["version"] for h in ray.get([e.health.remote() for e in engines])] == [1, 1]


@pytest.mark.ray
def test_alive_cells_average_gradients_and_regroup_after_a_death(ray_cluster) -> None:
    Cell = ray.remote(**TRAIN_CELL_ACTOR_OPTIONS)(TrainCell)
    cells = [Cell.remote(f"cell-{i}", "torch", CONFIG, 0, "full", 3e-3, None, 1.0, 5.0)
             for i in range(2)]
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    store, address = create_rendezvous_store()
    ray.get([cell.configure_group.remote(1, rank, 2, address) for rank, cell in enumerate(cells)])

    metrics = ray.get([cells[0].train_step.remote(_batch(engine, 0)),
                       cells[1].train_step.remote(_batch(engine, 100))])

    checksums = ray.get([cell.weights_checksum.remote() for cell in cells])
    assert [m["world_size"] for m in metrics] == [2.0, 2.0]
    assert metrics[0]["loss"] != metrics[1]["loss"]  # different batches ...
    assert checksums[0] == checksums[1]  # ... same averaged update

    _kill(cells[1])
    with pytest.raises(CollectiveError):
        ray.get(cells[0].train_step.remote(_batch(engine, 200)))
    ray.get(cells[0].configure_group.remote(2, 0, 1, address))
    assert ray.get(cells[0].train_step.remote(_batch(engine, 300)))["world_size"] == 1.0
    ray.kill(cells[0])
    del store


def test_set_state_heals_a_cell_with_weights_and_optimizer(tmp_path, sqlite_url: str) -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    healthy = TrainCell("cell-0", "torch", CONFIG, 0)
    healed = TrainCell("cell-1", "torch", CONFIG, 7)  # other seed: other weights until healed
    for start in (0, 50):
        healthy.train_step(_batch(engine, start))

    healed.set_state(healthy.get_state())
    batch = _batch(engine, 100)
    healthy.train_step(batch)
    healed.train_step(batch)

    assert healed.weights_checksum() == healthy.weights_checksum()
    assert healed.progress() == healthy.progress() == 3


def _rewarded(groups, rewards_of_group):
    """``groups`` with each sample's reward set by ``rewards_of_group(sample_position)``."""
    for group in groups:
        for position, sample in enumerate(group):
            sample.reward = rewards_of_group(position)
    return groups


def test_a_batch_without_learning_signal_leaves_weights_and_optimizer_alone() -> None:
    """Equal rewards in every group: zero advantages, a zero gradient. AdamW would still move
    the weights by its momentum from the step before (chaos seed 17's drift into a collapse);
    the cell counts the step and moves nothing."""
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    cell = TrainCell("cell-0", "torch", CONFIG, 0)
    initial = cell.weights_checksum()
    learned = cell.train_step(_rewarded(_batch(engine, 0), lambda i: float(i % 2)))
    after_signal = cell.weights_checksum()
    moments = [s["exp_avg"].clone() for s in cell.optimizer.state.values()]

    flat = cell.train_step(_rewarded(_batch(engine, 50), lambda i: 1.0))

    assert after_signal != initial and learned["optimizer_step_skipped"] == 0.0
    assert flat["grad_norm"] == 0.0 and flat["optimizer_step_skipped"] == 1.0
    assert cell.weights_checksum() == after_signal
    assert all(torch.equal(before, state["exp_avg"])
               for before, state in zip(moments, cell.optimizer.state.values(), strict=True))
    assert cell.progress() == 2


@pytest.mark.parametrize(("grad_norm", "signal"), [
    (0.0, False), (float("nan"), False), (float("inf"), False), (1e-12, True), (3.5, True)])
def test_only_a_finite_nonzero_gradient_is_a_learning_signal(grad_norm: float,
                                                             signal: bool) -> None:
    assert has_learning_signal(grad_norm) is signal


def test_checkpoint_round_trip_records_checkpoint_saved(tmp_path, sqlite_url: str) -> None:
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    cell = TrainCell("cell-0", "torch", CONFIG, 0, ledger_url=sqlite_url, run_id=RUN)
    ledger = Ledger.open(sqlite_url)
    ledger.start_run(RUN)
    epoch = ledger.promote(RUN, "cell-0", reason="start")
    cell.train_step(_batch(engine, 0))
    version = cell.update_weights([engine], epoch).version

    summary = cell.save_checkpoint(str(tmp_path / "ckpt" / "step1.pt"), epoch)
    restored = TrainCell("cell-1", "torch", CONFIG, 3)
    loaded = restored.load_checkpoint(summary["path"])

    saved = [e for e in ledger.events(RUN) if e.kind == "checkpoint_saved"]
    assert summary == loaded == {"train_step": 1, "version": version, "path": summary["path"]}
    assert [e.payload["path"] for e in saved] == [summary["path"]]
    assert restored.weights_checksum() == cell.weights_checksum()
    assert ledger.verify(RUN).ok
    cell.close()
    ledger.close()
