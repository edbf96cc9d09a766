"""Full and LoRA weight updates both end in the one finalize: every engine is stamped.

Real Ray actors (one publisher cell, two engines) and a real SQLite ledger.
"""

from __future__ import annotations

import pytest
import ray

from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TRAIN_CELL_ACTOR_OPTIONS, TrainCell
from actors.publishing.weight_sync import finalize_and_resume_engines, tensors_checksum
from ledger import Ledger

pytestmark = pytest.mark.ray

TASK = AdditionTask(seed=0)
RUN = "sync"


def _start(config: PolicyConfig, transport: str, ledger_url: str, backend: str = "torch"):
    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
    Cell = ray.remote(**TRAIN_CELL_ACTOR_OPTIONS)(TrainCell)
    engines = [Engine.remote(f"engine-{i}", backend, config, 0, TASK) for i in range(2)]
    cell = Cell.remote("cell-0", backend, config, 0, transport, ledger_url=ledger_url,
                       run_id=RUN)
    return cell, engines


def _train_once(cell, engines) -> None:
    """One GRPO step on fresh samples, so the cell's weights differ from the engines'.

    One sample of each group is rewarded and the rest are not, so the advantage (and the
    gradient) is never zero. The engines' concurrent calls share one generator, so what they
    sample depends on scheduling, and an untrained policy can miss in every sample of every
    group: on a loaded machine the LoRA test then saw adapters the step never changed."""
    groups = ray.get([engines[0].generate.remote(TASK.make_prompt(i), 8, i) for i in range(8)])
    for group in groups:
        for position, sample in enumerate(group):
            sample.reward = 1.0 if position == 0 else 0.0
    ray.get(cell.train_step.remote(groups))


def _ledger_with_publisher(url: str) -> tuple[Ledger, int]:
    ledger = Ledger.open(url)
    ledger.start_run(RUN)
    return ledger, ledger.promote(RUN, "cell-0", reason="start")


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_full_update_stamps_every_engine(ray_cluster, sqlite_url: str, backend: str) -> None:
    config = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
    cell, engines = _start(config, "full", sqlite_url, backend)
    ledger, epoch = _ledger_with_publisher(sqlite_url)
    _train_once(cell, engines)

    version = ray.get(cell.update_weights.remote(engines, epoch)).version

    health = ray.get([e.health.remote() for e in engines])
    cell_checksum = ray.get(cell.weights_checksum.remote())
    events = {event.kind: event for event in ledger.events(RUN)}
    assert version == 1 == ledger.head(RUN).version
    assert [(h["version"], h["epoch"], h["paused"]) for h in health] == [(1, epoch, False)] * 2
    assert ray.get([e.weights_checksum.remote() for e in engines]) == [cell_checksum] * 2
    assert events["weight_committed"].payload["checksum"] == cell_checksum
    assert events["weight_committed"].payload["transport"] == "full"
    assert sorted(events["engines_stamped"].payload["engine_ids"]) == ["engine-0", "engine-1"]
    assert ledger.verify(RUN).ok and ledger.verify(RUN).unstamped_versions == []
    for actor in (cell, *engines):
        ray.kill(actor)
    ledger.close()


def test_lora_update_moves_only_adapters_and_stamps_every_engine(ray_cluster,
                                                                 sqlite_url: str) -> None:
    config = PolicyConfig(vocab_size=TOKENIZER.vocab_size, lora_rank=4)
    cell, engines = _start(config, "lora", sqlite_url)
    ledger, epoch = _ledger_with_publisher(sqlite_url)
    base_before = ray.get([e.weights_checksum.remote() for e in engines])
    adapters_before = ray.get(engines[0].weights_checksum.remote(adapters_only=True))
    _train_once(cell, engines)

    version = ray.get(cell.update_weights.remote(engines, epoch)).version

    cell_adapters = ray.get(cell.weights_checksum.remote(adapters_only=True))
    committed = next(e for e in ledger.events(RUN) if e.kind == "weight_committed")
    stamped = next(e for e in ledger.events(RUN) if e.kind == "engines_stamped")
    assert cell_adapters != adapters_before  # the step trained the adapters
    assert version == 1
    assert [h["version"] for h in ray.get([e.health.remote() for e in engines])] == [1, 1]
    assert ray.get([e.weights_checksum.remote(adapters_only=True) for e in engines]) == (
        [cell_adapters] * 2
    )
    assert committed.payload["transport"] == "lora"
    assert committed.payload["checksum"] == cell_adapters  # only adapters were transferred
    assert sorted(stamped.payload["engine_ids"]) == ["engine-0", "engine-1"]
    # The whole-model checksum moved only through the adapters; the frozen base is the same.
    assert ray.get(cell.weights_checksum.remote()) == ray.get(engines[0].weights_checksum.remote())
    assert base_before[0] != ray.get(engines[0].weights_checksum.remote())
    assert ledger.verify(RUN).ok
    for actor in (cell, *engines):
        ray.kill(actor)
    ledger.close()


def test_checksum_is_order_independent_and_content_sensitive() -> None:
    import torch

    tensors = {"b": torch.ones(2), "a": torch.zeros(3)}

    assert tensors_checksum(tensors) == tensors_checksum(dict(reversed(tensors.items())))
    assert tensors_checksum(tensors) != tensors_checksum({**tensors, "b": torch.ones(2) * 2})


def test_finalize_stamps_the_living_and_resumes_them_despite_a_dead_one() -> None:
    config = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
    alive = [RolloutEngine(f"engine-{i}", "torch", config, 0, TASK) for i in range(2)]

    class DeadEngine:
        def stamp_and_resume(self, version: int, epoch: int) -> dict[str, str | None]:
            raise ConnectionError("actor died")

    for engine in alive:
        engine.begin_update(1)
    report = finalize_and_resume_engines([alive[0], DeadEngine(), alive[1]], 3, 1)

    assert report.stamped_engine_ids == ["engine-0", "engine-1"]
    assert list(report.failed) == [1]
    assert [(e.health()["version"], e.health()["paused"]) for e in alive] == [(3, False)] * 2
