"""Garbage collection while an actor starts (:mod:`actors.startup_gc`): held from a worker's
start, settled (heap frozen, collection on) when the outermost decorated ``__init__`` returns,
released after the hold's limit when nothing settles it, and a process never held is left
alone; on the session's real Ray cluster, a worker starts held and every actor a job starts
(cells, engines, the rollout manager) has settled it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import ray

from actors import startup_gc
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.policies.policy import PolicyConfig
from actors.startup_gc import (
    freeze_heap,
    hold_collection,
    is_held,
    settle_after_start,
    settle_heap,
    settles_heap,
)
from actors.task import TOKENIZER, AdditionTask
from ledger import Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.control.supervision import Supervisor
from tests.waiting import wait_until


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """Each test starts with collection on and nothing frozen, and leaves it so."""
    gc.unfreeze()
    gc.enable()
    yield
    settle_heap()  # cancels a hold a test left
    gc.unfreeze()
    gc.enable()


def test_a_hold_turns_collection_off_until_the_heap_is_settled() -> None:
    hold_collection()
    assert not gc.isenabled() and is_held()

    settle_heap()

    assert gc.isenabled() and not is_held()
    assert gc.get_freeze_count() > 0
    assert "rl-ledger-gc-hold" not in {thread.name for thread in threading.enumerate()}


def test_a_process_never_held_is_left_alone() -> None:
    gc.disable()  # someone else's choice, e.g. a test's

    freeze_heap()
    settle_heap()

    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_a_hold_nothing_settles_ends_at_its_limit_with_nothing_frozen() -> None:
    hold_collection(limit_s=0.2)
    assert not gc.isenabled()

    wait_until(gc.isenabled, timeout_s=10, what="collection back on after the hold's limit")

    assert not is_held() and gc.get_freeze_count() == 0


def test_a_new_hold_replaces_the_old_one_and_its_limit() -> None:
    hold_collection(limit_s=0.2)
    hold_collection(limit_s=60)

    threading.Event().wait(0.6)

    assert not gc.isenabled() and is_held()


def test_freezing_while_held_keeps_collection_off() -> None:
    hold_collection()

    freeze_heap()

    assert gc.get_freeze_count() > 0 and not gc.isenabled() and is_held()


class _Base:
    @settles_heap
    def __init__(self) -> None:
        self.held_in_base = is_held()


class _Derived(_Base):
    @settles_heap
    def __init__(self) -> None:
        super().__init__()
        self.held_after_base = is_held()


def test_the_heap_settles_when_the_outermost_init_returns() -> None:
    hold_collection()

    built = _Derived()

    assert built.held_in_base and built.held_after_base
    assert gc.isenabled() and not is_held()


def test_a_failed_init_settles_nothing_and_leaves_no_init_in_progress() -> None:
    class Failing:
        @settles_heap
        def __init__(self) -> None:
            raise ValueError("cannot build")

    hold_collection()
    with pytest.raises(ValueError, match="cannot build"):
        Failing()
    assert not gc.isenabled() and is_held()  # nothing was built (a Ray actor would be dead)

    _Base()

    assert gc.isenabled() and not is_held()


@ray.remote(num_cpus=0.05)
class _Bare:
    """An actor of no project class: nothing settles its worker's heap."""

    def collection(self) -> tuple[bool, bool]:
        return gc.isenabled(), startup_gc.is_held()


def _collection(actor: ray.actor.ActorHandle) -> tuple[bool, bool, int]:
    return ray.get(actor.__ray_call__.remote(
        lambda _: (gc.isenabled(), startup_gc.is_held(), gc.get_freeze_count())), timeout=120)


def test_a_workers_collection_is_held_from_its_start_and_a_project_actor_settles_it(
        ray_cluster) -> None:
    """The session's cluster is started as a job's (``start_local_ray``)."""
    bare = _Bare.remote()
    Engine = ray.remote(**{**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.05})(RolloutEngine)
    engine = Engine.remote("engine-0", "torch", PolicyConfig(vocab_size=TOKENIZER.vocab_size),
                           0, AdditionTask(seed=0))

    assert ray.get(bare.collection.remote(), timeout=120) == (False, True)
    enabled, held, frozen = _collection(engine)
    assert enabled and not held and frozen > 100_000  # torch's modules among them
    ray.kill(bare)
    ray.kill(engine)


def test_every_actor_class_the_control_plane_starts_settles_its_heap() -> None:
    """The classes ``orchestrator.control`` makes remote, but the rollout manager (the next
    test); one missed would run its worker without collection until the hold's limit."""
    from actors.engines.vllm.engine import VLLMEngine
    from actors.llama_cell import LlamaTrainCell
    from actors.train_cell import TrainCell

    for actor_class in (RolloutEngine, VLLMEngine, TrainCell, LlamaTrainCell):
        init = actor_class.__init__
        assert getattr(init, "__wrapped__", None) is not None, actor_class.__name__
        assert init.__code__ is settles_heap(lambda self: None).__code__, actor_class.__name__


def test_an_actor_settled_after_its_start_collects_again(ray_cluster) -> None:
    bare = _Bare.remote()

    settle_after_start(bare)

    enabled, held, frozen = _collection(bare)
    assert enabled and not held and frozen > 0
    ray.kill(bare)


def test_every_actor_a_job_starts_has_settled_its_heap(ray_cluster, sqlite_url: str,
                                                        tmp_path) -> None:
    config = RunConfig(run_id="settled", db=sqlite_url, num_cells=2, num_engines=2,
                       rollout_batch_size=4, n_samples_per_prompt=4)
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run("settled")
        supervisor = Supervisor(config, ledger, RunLayout(tmp_path))
        try:
            supervisor.start_engines_and_cells(with_manager=True)
            actors = {**supervisor.engines, "manager": supervisor.manager,
                      **{cell_id: supervisor.cells.actor(cell_id)
                         for cell_id in supervisor.cells.cell_ids}}

            states = {name: _collection(actor) for name, actor in actors.items()}
        finally:
            supervisor.stop()

    assert sorted(states) == ["cell-0", "cell-1", "engine-0", "engine-1", "manager"]
    for name, (enabled, held, frozen) in states.items():
        assert enabled and not held and frozen > 0, name
